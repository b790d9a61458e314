"""mini-trainer (eager and `--compile`) against TRL's `SFTTrainer`, padding-free and padded.

Every side trains the same model from the same weights on the same samples in the same order,
in this one process, on the CPU, in fp32:
- mini-trainer: the real engine (`mini_trainer.train.main`, a world of one: FSDP2, packed rows,
  per-sample attention, chunked loss), one packed micro-batch per step (the token cap is above
  any step's tokens), with and without `--compile`;
- TRL `SFTTrainer` with `padding_free=True` (one row per step, position ids restart per sample:
  transformers' sdpa path, what TRL does on a machine without flash-attn) and with ordinary
  padding (`padding_free=False`), fed the samples in mini-trainer's order (no shuffling).
The loss is the same (mean over completion tokens of the step: TRL gets mini-trainer's loss
mask as `completion_mask`), and so is the optimizer: AdamW, betas (0.9, 0.95), eps 1e-8, no
weight decay, gradient norm clipped at 1.0, constant learning rate.

Throughput is real (non-pad) tokens per second over the steps after the first `--warm-steps`
(the same steps for every side), as medians of `--repeats` runs; the sides alternate within each
repeat. Start-up (process group, model load, first steps' set-up) and, for the compiled side,
the compile time (its first run's warm-up steps minus eager's) are reported apart. Models: the
demo Llama (128 wide, 4 layers) and a 512-wide Llama of 8 layers with the demo tokenizer, both
built here from seeds.

It also prints the machine (CPU model, logical CPUs, threads), the load average before and
after, and the machine's fp32 GEMM peak at the same thread count (measured before and after the
runs); each side's tokens/s is also given as a fraction of that peak, counting 6 FLOPs per
parameter per token (forward and backward of the linear layers; attention's own FLOPs left out,
so the fraction is a slight underestimate). `--background-load N` starts N busy processes for
the whole run (and stops them after): a load the script states and makes itself.

    pip install -c constraints.txt -e ".[bench]"
    python benchmarks/peers.py [--models demo,wide512] [--repeats 3] [--steps 10]
        [--background-load N]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from machine import (
    gemm_peak_gflops,
    load_line,
    machine_line,
    start_background_load,
    stop_background_load,
)
from safetensors import safe_open

from mini_trainer.batching.sampler import BatchSampler
from mini_trainer.demo.assets import DemoSpec, build_demo_assets

MODELS = {
    "demo": DemoSpec(),
    "wide512": DemoSpec(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4,
                        intermediate_size=1536),
}  # fmt: skip
SIDES = ("trl_padded", "trl_padding_free", "mini_trainer", "mini_trainer_compiled")
LR = 1e-4


@dataclass
class Run:
    """One side's run: wall time, per-step seconds and real tokens."""

    wall_s: float
    step_s: list[float]
    step_tokens: list[int]

    def tokens_per_s(self, warm: int) -> float:
        return sum(self.step_tokens[warm:]) / sum(self.step_s[warm:])

    def startup_s(self) -> float:
        return self.wall_s - sum(self.step_s)

    def warmup_s(self, warm: int) -> float:
        return sum(self.step_s[:warm])


def ordered_samples(data: Path, batch_size: int, steps: int, seed: int) -> list[dict]:
    """The samples of `data` in the order mini-trainer's sampler draws them for `steps` steps."""
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    sampler = BatchSampler(len(rows), batch_size, seed)
    return [rows[i] for _ in range(steps) for i in sampler.next_batch().indices]


def fresh_world() -> None:
    """No process group and no rendezvous variables left by the previous side.

    mini-trainer's world of one sets MASTER_ADDR/RANK/...; seeing them, TRL's accelerate starts a
    process group of its own and leaves it up, which the next mini-trainer run would then find.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        os.environ.pop(name, None)  # a fresh world of one, on a fresh port, every run


def run_mini_trainer(model: Path, data: Path, out: Path, args, compiled: bool) -> Run:
    from mini_trainer.train import main

    fresh_world()
    argv = [
        "--model-name-or-path", str(model), "--data-path", str(data), "--output-dir", str(out),
        "--batch-size", str(args.batch_size), "--max-tokens-per-gpu", "65536",
        "--learning-rate", str(LR), "--lr-scheduler", "constant", "--seed", str(args.seed),
        "--training-mode", "step", "--max-steps", str(args.steps), "--beta1", "0.9",
        "--beta2", "0.95", "--eps", "1e-8", "--weight-decay", "0", "--grad-clip", "1.0",
        *(["--compile"] if compiled else []),
    ]  # fmt: skip
    started = time.perf_counter()
    status = main(argv)
    wall = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"mini-trainer exited {status}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["num_micro_batches"] == 1 for r in rows), "a step was split: raise the cap"
    return Run(wall, [r["step_time_s"] for r in rows], [r["num_tokens"] for r in rows])


def run_trl(model_dir: Path, samples: list[dict], out: Path, args, padding_free: bool) -> Run:
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    class InOrder(SFTTrainer):
        """SFTTrainer that takes the samples in the given order (mini-trainer's)."""

        def _get_train_sampler(self, *_args, **_kwargs):
            return SequentialSampler(self.train_dataset)

    class StepClock(TrainerCallback):
        def __init__(self):
            self.begun, self.seconds = 0.0, []

        def on_step_begin(self, *_args, **_kwargs):
            self.begun = time.perf_counter()

        def on_step_end(self, *_args, **_kwargs):
            self.seconds.append(time.perf_counter() - self.begun)

    fresh_world()
    started = time.perf_counter()
    dataset = Dataset.from_list([
        {"input_ids": s["input_ids"], "completion_mask": [int(x != -100) for x in s["labels"]]}
        for s in samples
    ])  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.config.use_cache = False  # a cache makes packed samples attend to each other
    config = SFTConfig(
        output_dir=str(out), per_device_train_batch_size=args.batch_size, max_steps=args.steps,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9,
        adam_beta2=0.95, adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0,
        padding_free=padding_free, max_length=None, completion_only_loss=True,
        save_strategy="no", report_to=[], logging_steps=10**6, use_cpu=True,
        dataloader_num_workers=0, seed=args.seed, disable_tqdm=True,
    )  # fmt: skip
    clock = StepClock()
    trainer = InOrder(model=model, args=config, train_dataset=dataset, callbacks=[clock])
    trainer.train()
    wall = time.perf_counter() - started
    fresh_world()
    tokens = [
        sum(len(s["input_ids"]) for s in samples[k * args.batch_size : (k + 1) * args.batch_size])
        for k in range(args.steps)
    ]
    return Run(wall, clock.seconds, tokens)


def median(values: list[float]) -> float:
    return statistics.median(values)


def bench_model(name: str, spec: DemoSpec, args, root: Path) -> dict:
    folder = root / name
    build_demo_assets(folder, spec)
    data = folder / "data" / f"{args.task}.train.jsonl"
    samples = ordered_samples(data, args.batch_size, args.steps, args.seed)
    lengths = np.array([len(s["input_ids"]) for s in samples])
    print(f"\n== {name}: hidden {spec.hidden_size}, {spec.num_layers} layers; {args.steps} "
          f"steps x {args.batch_size} samples, {lengths.sum()} tokens (sample length median "
          f"{np.median(lengths):.0f}, max {lengths.max()})")  # fmt: skip
    runs: dict[str, list[Run]] = {side: [] for side in args.sides}
    for repeat in range(args.repeats):
        for side in args.sides:
            torch.manual_seed(args.seed)
            out = folder / "runs" / f"{side}_{repeat}"
            if side.startswith("trl"):
                run = run_trl(folder / "model", samples, out, args, side == "trl_padding_free")
            else:
                run = run_mini_trainer(
                    folder / "model", data, out, args, side == "mini_trainer_compiled"
                )
            runs[side].append(run)
            warm = args.warm_steps
            print(f"  repeat {repeat} {side}: {run.tokens_per_s(warm):,.0f} tok/s, start-up "
                  f"{run.startup_s():.1f} s, warm-up steps {run.warmup_s(warm):.1f} s",
                  flush=True)  # fmt: skip
    assert len({tuple(r.step_tokens) for side in runs.values() for r in side}) == 1, (
        "the sides did not train on the same tokens"
    )
    result: dict = {"parameters": count_parameters(folder / "model")}
    result |= {
        side: {
            "tokens_per_s": median([r.tokens_per_s(args.warm_steps) for r in side_runs]),
            "startup_s": median([r.startup_s() for r in side_runs]),
            "warmup_s": median([r.warmup_s(args.warm_steps) for r in side_runs]),
            "first_warmup_s": side_runs[0].warmup_s(args.warm_steps),
        }
        for side, side_runs in runs.items()
    }
    return result


def count_parameters(model_dir: Path) -> int:
    """Parameters of the saved model, from its safetensors files' tensor shapes."""
    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as weights:
            names = weights.keys()
            total += sum(int(np.prod(weights.get_slice(k).get_shape())) for k in names)
    return total


def print_table(name: str, result: dict, peak_gflops: float) -> None:
    sides = {side: r for side, r in result.items() if side in SIDES}
    base = sides.get("trl_padding_free", {}).get("tokens_per_s")
    flops_per_token = 6 * result["parameters"]
    print(f"\n{name}: {result['parameters']:,} parameters, {flops_per_token / 1e6:.1f} MFLOP per "
          f"token (6 x parameters); GEMM peak {peak_gflops:.0f} GFLOP/s")  # fmt: skip
    print(f"| {name} | tokens/s (median) | vs TRL padding-free | of GEMM peak | start-up s | "
          "warm-up steps s |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    for side, r in sides.items():
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        share = r["tokens_per_s"] * flops_per_token / (peak_gflops * 1e9)
        print(f"| {side} | {r['tokens_per_s']:,.0f} | {ratio} | {share:.0%} | "
              f"{r['startup_s']:.1f} | {r['warmup_s']:.1f} |")  # fmt: skip
    if "mini_trainer_compiled" in result and "mini_trainer" in result:
        compile_s = (
            result["mini_trainer_compiled"]["first_warmup_s"] - result["mini_trainer"]["warmup_s"]
        )
        print(f"compile time (first compiled run's warm-up steps minus eager's): {compile_s:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,wide512", help=f"of {', '.join(MODELS)}")
    parser.add_argument("--sides", default=",".join(SIDES), help="in the order they run")
    parser.add_argument("--task", default="sort", help="demo task whose samples are used")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warm-steps", type=int, default=2, help="steps left out of tokens/s")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="busy processes to run beside the benchmark (a stated load)",
    )
    args = parser.parse_args()
    args.sides = args.sides.split(",")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    logging.getLogger("mini_trainer").setLevel(logging.WARNING)
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print(machine_line(args.threads))
    print(load_line("before"))
    peak_before = gemm_peak_gflops(args.threads)
    print(f"fp32 GEMM peak before, {args.threads} thread(s): {peak_before:.0f} GFLOP/s")
    background = start_background_load(args.background_load)
    if background:
        print(f"started {len(background)} busy background process(es) for the whole run")
    results = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.models.split(","):
                results[name] = bench_model(name, MODELS[name], args, Path(tmp))
        peak_after = gemm_peak_gflops(args.threads)
    finally:
        stop_background_load(background)
    running = " (the background load still running)" if background else ""
    print(f"\nfp32 GEMM peak after{running}: {peak_after:.0f} GFLOP/s")
    for name, result in results.items():
        print_table(name, result, peak_before)
    print(load_line("after"))
    for result in results.values():
        result["gemm_peak_gflops"] = {"before": peak_before, "after": peak_after}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
