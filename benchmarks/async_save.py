"""How long a state save blocks each rank: synchronous against `--async-save`, and the step time
around a save.

Two ranks (torchrun, gloo, the CPU), FSDP2 per decoder layer and the root, as the engine shards;
a random Llama of about 105M parameters (768 wide, 8 layers, a 32,000-token vocabulary; fp32),
AdamW with its state after one step. Both sides run in this one job, alternating, `--repeats`
times each, with the engine's own `checkpoint.save_state` (all ranks' files, checksums, atomic
publish, `--keep-states 1`):
- sync: the rank is blocked for the whole `save_state` call;
- async: blocked while `save_state` stages the state (the host copy) and hands it to the
  `BackgroundWriter`, and again if the write has not finished when the next save is due, here
  after `--steps-between` training steps (the wait at the next save, `Saver.finish_pending`);
  those steps' times, with a write in flight, against steps with none, are the step time around
  a save.
Medians per rank are printed, with the CPU model and the load average before and after (the
machine is shared: the figures are only comparable within one run).

    python benchmarks/async_save.py                 # starts torchrun --nproc-per-node 2 itself
    python benchmarks/async_save.py --repeats 5 --steps-between 4 --out /path/on/the/real/disk
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, load_line  # noqa: E402

WIDTH, LAYERS, VOCAB, TOKENS = 768, 8, 32000, 64


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps-between", type=int, default=3)
    parser.add_argument("--out", help="folder for the states (default: a temporary folder)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def launch(args: argparse.Namespace) -> int:
    """Start the two ranks under torchrun, in a temporary folder unless `--out` is given."""
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="async-save-"))
    print(f"cpu: {cpu_model()}, {os.cpu_count()} logical CPUs", flush=True)
    print(load_line("before"), flush=True)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        __file__, "--worker", "--out", str(out),
        "--repeats", str(args.repeats), "--steps-between", str(args.steps_between),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        status = subprocess.run(command, env=env).returncode
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    print(load_line("after"), flush=True)
    return status


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    from mini_trainer.distributed.runtime import init_runtime, shutdown
    from mini_trainer.training import checkpoint
    from mini_trainer.training.async_save import BackgroundWriter, staged_bytes
    from mini_trainer.training.trainer_state import TrainerState

    runtime = init_runtime()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=4 * WIDTH,
        num_hidden_layers=LAYERS, num_attention_heads=12, num_key_value_heads=4,
        tie_word_embeddings=False, use_cache=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95))
    ids = torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(1))

    def step() -> float:
        started = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dist.barrier()
        return time.perf_counter() - started

    step()  # the optimizer's state exists from here on
    out = Path(args.out)
    writer = BackgroundWriter(pin=False)
    assert writer.group is not None  # made now (a run makes it at its first save), not timed
    counter = iter(range(1, 10**6))
    times: dict[str, list[float]] = {
        "sync": [], "async_stage": [], "async_wait": [], "step_idle": [], "step_writing": []
    }  # fmt: skip

    def save(with_writer) -> float:
        dist.barrier()
        started = time.perf_counter()
        checkpoint.save_state(out, next(counter), model, optimizer, TrainerState(), runtime, 1,
                              with_writer)  # fmt: skip
        return time.perf_counter() - started

    for _ in range(args.repeats):
        times["sync"].append(save(None))
        times["step_idle"] += [step() for _ in range(args.steps_between)]
        times["async_stage"].append(save(writer))
        times["step_writing"] += [step() for _ in range(args.steps_between)]
        started = time.perf_counter()
        writer.wait()  # what the next save (or the run's end) waits for
        times["async_wait"].append(time.perf_counter() - started)

    state_bytes = staged_bytes(get_state_dict(model, optimizer))  # (model, optimizer) state
    gathered: list = [None] * runtime.world_size
    dist.all_gather_object(gathered, (times, state_bytes))
    if runtime.is_main:
        report(gathered, params, args)
    shutdown()


def report(gathered: list, params: int, args: argparse.Namespace) -> None:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    print(f"model: Llama {WIDTH} wide, {LAYERS} layers, {params / 1e6:.1f}M parameters (fp32), "
          f"AdamW; 2 ranks, gloo, 1 thread each; {args.repeats} saves per side, "
          f"{args.steps_between} steps between saves")  # fmt: skip
    for rank, (times, state_bytes) in enumerate(gathered):
        sync = med(times["sync"])
        blocked = [s + w for s, w in zip(times["async_stage"], times["async_wait"], strict=True)]
        print(f"rank {rank}: state shard {state_bytes / 2**20:.0f} MiB; blocked by a save "
              f"(median): sync {sync:.2f} s; async {med(blocked):.3f} s "
              f"(staging {med(times['async_stage']):.3f} s + waiting at the next save "
              f"{med(times['async_wait']):.3f} s) = {med(blocked) / sync:.3f}x sync")  # fmt: skip
        print(f"rank {rank}: each save, sync: {_seconds(times['sync'])}; async staging: "
              f"{_seconds(times['async_stage'])} (the first allocates the host copy, later ones "
              "write into it)")  # fmt: skip
        print(f"rank {rank}: step time (median): {med(times['step_idle']):.2f} s with no write "
              f"in flight, {med(times['step_writing']):.2f} s while the background write "
              "runs")  # fmt: skip


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{value:.3f}" for value in values) + " s"


if __name__ == "__main__":
    arguments = parse()
    if arguments.worker:
        worker(arguments)
    else:
        sys.exit(launch(arguments))
