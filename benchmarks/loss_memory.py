"""Chunked linear cross-entropy against logits + F.cross_entropy: peak memory and time.

    python benchmarks/loss_memory.py [--tokens 8192 --vocab 32000 --hidden 1024]

Both sides compute the summed loss of `hidden @ weight.T` and its backward (grads for hidden and
weight), fp32 on CPU. Goals (issue 5): peak memory at most 0.3x and time at most 1.2x the
reference.

Peak memory: each (side, chunk size) runs in a fresh subprocess with MALLOC_MMAP_THRESHOLD_=65536,
so every allocation of 64 KiB or more is its own mmap and goes back to the OS when freed; resident
memory (RSS) then tracks live tensors. The child builds the inputs, warms the kernels up on a
64-token problem, resets the kernel's RSS high-water mark (/proc/self/clear_refs), runs one
forward + backward and reports VmHWM minus the RSS just before. That growth includes the
gradients left in .grad (N x H + V x H, the same on both sides).

Time: in this process, median of --repeats forward + backward runs after one warm-up round; the
sides are interleaved in every round so load from other processes hits them alike.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from mini_trainer.training.loss import (  # noqa: E402
    DEFAULT_CHUNK_SIZE,
    chunked_linear_cross_entropy,
    linear_cross_entropy_reference,
)

REFERENCE = "reference"


def make_inputs(tokens: int, vocab: int, hidden: int, ignored: float = 0.0, seed: int = 0):
    """Unit hidden states, 1/sqrt(H)-scaled head weights, a fraction of targets set to -100."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=gen).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen) * hidden**-0.5).requires_grad_()
    t = torch.randint(0, vocab, (tokens,), generator=gen)
    t[torch.rand(tokens, generator=gen) < ignored] = -100
    return h, w, t


def run_side(side: str, h, w, t) -> float:
    """One forward + backward; returns the loss value."""
    h.grad = w.grad = None
    if side == REFERENCE:
        loss = linear_cross_entropy_reference(h, w, t)
    else:
        loss = chunked_linear_cross_entropy(h, w, t, chunk_size=int(side))
    loss.backward()
    return loss.item()


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child_peak(side: str, args) -> dict:
    """In a fresh process: RSS growth (bytes) during one forward + backward of `side`."""
    h, w, t = make_inputs(args.tokens, args.vocab, args.hidden, args.ignored_fraction)
    run_side(side, *make_inputs(64, args.vocab, args.hidden, seed=1))  # kernel/thread-pool warm-up
    gc.collect()
    h.grad = w.grad = None
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = _status_kb("VmRSS")
    loss = run_side(side, h, w, t)
    peak = _status_kb("VmHWM")
    return {"peak_growth_bytes": (peak - base) * 1024, "loss": loss}


def measure_peak(side: str, args) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, __file__, "--child", side, "--tokens", str(args.tokens)]
    cmd += ["--vocab", str(args.vocab), "--hidden", str(args.hidden)]
    cmd += ["--ignored-fraction", str(args.ignored_fraction)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument(
        "--ignored-fraction",
        type=float,
        default=0.0,
        help="share of targets set to -100 (the chunked side skips those rows; default 0 keeps "
        "the comparison like for like)",
    )
    parser.add_argument("--chunk-sizes", default="512,1024,2048,4096")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    if args.child:
        print(json.dumps(child_peak(args.child, args)))
        return

    sides = [REFERENCE] + [s.strip() for s in args.chunk_sizes.split(",")]
    mb = 1 / 2**20
    print(
        f"# loss_memory: N={args.tokens} tokens, V={args.vocab}, H={args.hidden}, fp32, CPU, "
        f"{args.threads} threads, ignored targets {args.ignored_fraction:.0%}, "
        f"torch {torch.__version__}, {platform.machine()}"
    )
    print(f"# full N x V fp32 logits would be {args.tokens * args.vocab * 4 * mb:.0f} MiB")

    peaks = {}
    for side in sides:
        peaks[side] = measure_peak(side, args)
        print(f"  peak measured: {side:>9}: {peaks[side]['peak_growth_bytes'] * mb:8.0f} MiB")

    h, w, t = make_inputs(args.tokens, args.vocab, args.hidden, args.ignored_fraction)
    times: dict[str, list[float]] = {s: [] for s in sides}
    losses = {}
    for round_ in range(args.repeats + 1):  # round 0 is the warm-up
        for side in sides:
            start = time.perf_counter()
            losses[side] = run_side(side, h, w, t)
            elapsed = time.perf_counter() - start
            if round_:
                times[side].append(elapsed)
        print(f"  round {round_} done" + (" (warm-up)" if not round_ else ""), flush=True)

    ref_peak = peaks[REFERENCE]["peak_growth_bytes"]
    ref_time = statistics.median(times[REFERENCE])
    print()
    print(
        "| side | chunk | peak MiB | peak ratio | time s (median) | time ratio | loss rel. diff |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for side in sides:
        peak = peaks[side]["peak_growth_bytes"]
        med = statistics.median(times[side])
        rel = abs(losses[side] - losses[REFERENCE]) / abs(losses[REFERENCE])
        name = "logits + F.cross_entropy" if side == REFERENCE else "chunked"
        chunk = "-" if side == REFERENCE else side
        verdict = ""
        if side != REFERENCE:
            mem_ok = "ok" if peak / ref_peak <= 0.3 else "MISS"
            time_ok = "ok" if med / ref_time <= 1.2 else "MISS"
            verdict = f" (memory {mem_ok}, time {time_ok})"
        print(
            f"| {name}{verdict} | {chunk} | {peak * mb:.0f} | {peak / ref_peak:.3f} | {med:.2f} | "
            f"{med / ref_time:.3f} | {rel:.1e} |"
        )
    print(
        f"\n(default chunk size in mini_trainer.training.loss: {DEFAULT_CHUNK_SIZE}; "
        "goals: peak ratio <= 0.3, time ratio <= 1.2)"
    )


if __name__ == "__main__":
    main()
