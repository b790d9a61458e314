"""Benchmark of the micro-batch planner: speed, and balance against simpler batching.

Run from the repository root:

    python benchmarks/packing.py [--steps 2000] [--seed 0]

1. Speed: 1,000,000 lengths (lognormal, clipped to 16..8192), 8 ranks, cap 16,384. The numba
   planner `plan_micro_batches` against `plan_micro_batches_reference`, the same algorithm in
   pure Python; their plans must be identical. Compilation is measured apart: a fresh numba cache
   folder is used, so the first call compiles, and a second process loads the cached kernels.
2. Balance: `--steps` global batches of 128 samples from the same distribution, 8 ranks, cap
   16,384, split by
   - LPT: `plan_micro_batches`;
   - padded: a fixed number of samples per rank per micro-batch, padded to the longest of them
     (Hugging Face's default collator pads each rank's batch to its longest sample). Two samples
     per rank: the most that always fits the cap when a sample may have 8,192 tokens;
   - first-fit: samples in batch order, each into the first bin with room (a new bin when none
     has), bins dealt to ranks in order, no balancing;
   - first-fit decreasing: the same with samples sorted longest first.
   Load efficiency = real tokens / (ranks x the most-loaded rank's processed tokens, summed over
   micro-batches), over all steps: the share of the ranks' time spent on real tokens, when every
   rank waits for the slowest at every micro-step and time is proportional to tokens. For padded
   batching a rank's processed tokens include its padding. Micro-batch count is compared with
   the lower bound ceil(tokens / (ranks x cap)) per step, summed over steps.
   The balance part is repeated for other medians of the distribution, since the packer's
   results depend on how full the lower bound's micro-batches are.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# A fresh cache, so the first call below really compiles (set before numba is imported).
os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="mini_trainer-bench-numba-")

import numpy as np  # noqa: E402

from mini_trainer.batching.packing import plan_micro_batches  # noqa: E402
from mini_trainer.batching.packing_reference import plan_micro_batches_reference  # noqa: E402

NUM_RANKS = 8
CAP = 16_384
MIN_LEN, MAX_LEN = 16, 8192
SIGMA = 1.0


def sample_lengths(rng: np.random.Generator, n: int, median: float) -> np.ndarray:
    raw = rng.lognormal(np.log(median), SIGMA, size=n)
    return np.clip(np.rint(raw), MIN_LEN, MAX_LEN).astype(np.int64)


def best_of(fn, repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


CACHED_LOAD_SCRIPT = """
import sys, time
import numpy as np
sys.path.insert(0, {root!r})
start = time.perf_counter()
from mini_trainer.batching.packing import plan_micro_batches
plan_micro_batches(np.array([3, 2, 1]), 2, 4)
print(time.perf_counter() - start)
"""


def speed(seed: int, median: float) -> None:
    lengths = sample_lengths(np.random.default_rng(seed), 1_000_000, median)
    print(f"== speed: 1,000,000 lengths (median {median:g}, mean {lengths.mean():.0f}), ", end="")
    print(f"{NUM_RANKS} ranks, cap {CAP:,}")

    start = time.perf_counter()
    plan_micro_batches(np.array([3, 2, 1]), 2, 4)
    compile_s = time.perf_counter() - start
    cached = subprocess.run(
        [sys.executable, "-c", CACHED_LOAD_SCRIPT.format(root=str(ROOT))],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ),
    )
    cached_s = float(cached.stdout.strip())

    numba_s, plan = best_of(lambda: plan_micro_batches(lengths, NUM_RANKS, CAP), repeats=3)
    as_list = lengths.tolist()
    python_s, reference = best_of(
        lambda: plan_micro_batches_reference(as_list, NUM_RANKS, CAP), repeats=1
    )
    assert plan == reference, "numba and pure-Python plans differ"
    bound = -(-int(lengths.sum()) // (NUM_RANKS * CAP))
    print(f"compile (first call, empty cache)   {compile_s:8.2f} s")
    print(f"import + first call, cached kernels {cached_s:8.2f} s   (new process)")
    print(f"numba planner (best of 3)           {numba_s:8.3f} s   goal < 1 s")
    print(f"pure-Python planner                 {python_s:8.3f} s")
    print(f"speed-up                            {python_s / numba_s:8.1f} x   goal >= 5x")
    print(f"plans identical: yes; micro-batches {len(plan):,} (bound {bound:,})")
    print()


def lpt(lengths: np.ndarray) -> list[list[int]]:
    """Per micro-batch, per rank: processed tokens, for the LPT planner."""
    plan = plan_micro_batches(lengths, NUM_RANKS, CAP)
    return [[int(lengths[rank].sum()) for rank in micro] for micro in plan]


def padded(lengths: np.ndarray, per_rank: int = CAP // MAX_LEN) -> list[list[int]]:
    """Fixed samples per rank per micro-batch, each rank padded to its longest sample."""
    loads, per_micro = [], per_rank * NUM_RANKS
    for start in range(0, lengths.size, per_micro):
        chunk = lengths[start : start + per_micro]
        ranks = [chunk[r * per_rank : (r + 1) * per_rank] for r in range(NUM_RANKS)]
        loads.append([int(r.size * r.max()) if r.size else 0 for r in ranks])
    return loads


def first_fit(lengths: np.ndarray, decreasing: bool = False) -> list[list[int]]:
    """Each sample into the first bin with room; bins dealt to ranks in order, unbalanced."""
    order = np.argsort(-lengths, kind="stable") if decreasing else np.arange(lengths.size)
    bins: list[int] = []
    for length in lengths[order].tolist():
        for b, load in enumerate(bins):
            if load + length <= CAP:
                bins[b] += length
                break
        else:
            bins.append(length)
    bins += [0] * (-len(bins) % NUM_RANKS)  # ranks without a bin run a dummy
    return [bins[i : i + NUM_RANKS] for i in range(0, len(bins), NUM_RANKS)]


def padded_tokens(lengths: np.ndarray, per_rank: int = CAP // MAX_LEN) -> int:
    return sum(sum(micro) for micro in padded(lengths, per_rank))


METHODS = {
    "LPT (this planner)": lpt,
    "padded, 2 per rank": padded,
    "first-fit": first_fit,
    "first-fit decreasing": lambda x: first_fit(x, decreasing=True),
}


def balance(seed: int, steps: int, median: float, batch_size: int = 128) -> None:
    rng = np.random.default_rng(seed + 1)
    batches = [sample_lengths(rng, batch_size, median) for _ in range(steps)]
    tokens = sum(int(b.sum()) for b in batches)
    bounds = [-(-int(b.sum()) // (NUM_RANKS * CAP)) for b in batches]
    print(
        f"== balance: {steps} steps x {batch_size} samples (median {median:g}, "
        f"mean {tokens / steps / batch_size:.0f} tokens/sample, {tokens / steps:,.0f} "
        f"tokens/step), {NUM_RANKS} ranks, cap {CAP:,}; lower bound {sum(bounds) / steps:.2f} "
        "micro-batches/step"
    )
    print(
        f"{'method':<22} {'efficiency':>10} {'micro/step':>10} {'vs bound':>9} "
        f"{'steps at bound':>14} {'plan ms/step':>12}"
    )
    results = {}
    for name, method in METHODS.items():
        start = time.perf_counter()
        loads = [method(b) for b in batches]
        ms = (time.perf_counter() - start) / steps * 1e3
        busiest = sum(max(micro) for step in loads for micro in step)
        counts = [len(step) for step in loads]
        assert all(max(micro) <= CAP for step in loads for micro in step)
        results[name] = tokens / (NUM_RANKS * busiest)
        at_bound = sum(c == b for c, b in zip(counts, bounds, strict=True)) / steps
        print(
            f"{name:<22} {results[name]:>10.2%} {sum(counts) / steps:>10.2f} "
            f"{sum(counts) / sum(bounds):>8.3f}x {at_bound:>14.1%} {ms:>12.2f}"
        )
    pad = tokens / sum(padded_tokens(b) for b in batches)
    print(f"(padded: real tokens / all padded tokens = {pad:.2%}, without waiting for ranks)")
    ratios = ", ".join(
        f"{results['LPT (this planner)'] / value:.2f}x {name}"
        for name, value in results.items()
        if name != "LPT (this planner)"
    )
    print(f"LPT efficiency relative to: {ratios}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--median", type=float, default=600.0, help="median sample length")
    parser.add_argument("--also-medians", type=float, nargs="*", default=[250.0, 1500.0])
    args = parser.parse_args()
    print(f"lengths: lognormal(log(median), sigma={SIGMA}) rounded, clipped to ", end="")
    print(f"{MIN_LEN}..{MAX_LEN}; seed {args.seed}\n")
    speed(args.seed, args.median)
    for median in [args.median, *args.also_medians]:
        balance(args.seed, args.steps, median)


if __name__ == "__main__":
    main()
