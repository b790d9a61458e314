"""Validation during training: its throughput against `mini-trainer evaluate`, and its overhead.

Two measurements on the demo assets (built into a temporary folder), 200 validation samples
(the first 200 of sort's eval file):

- `throughput` (one process, a world of one, fp32 CPU): the training model, built as the loop
  builds it (`build_model` with the training loss, train mode), scored by `Validator.evaluate`
  (what the loop calls), against `evaluate_model` (what `mini-trainer evaluate` calls, which
  loads its own model) on the same samples. Only the evaluation loop is timed on each side; the
  sides alternate `--repeats` times (which goes first alternates too); the medians of tokens
  per second and their ratio are printed (goal: inside / evaluate >= 0.9). The losses must
  agree (1e-5 relative).
- `overhead`: the demo run (config/config.yaml's training: 2 ranks, batch 32, cap 2048, 80
  steps, cosine) through `mini-trainer train`, without validation and with validation of the
  200 samples every 20 steps, alternating `--repeats` times each; the medians of the wall-clock
  times and their difference are printed, with the summed `val_time_s` of the validated runs.

    python benchmarks/validation.py throughput [--repeats 5] [--threads 1]
    python benchmarks/validation.py overhead [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO_TRAINING = {
    "batch-size": 32, "max-tokens-per-gpu": 2048, "training-mode": "step", "max-steps": 80,
    "num-warmup-steps": 8, "lr-scheduler": "cosine", "seed": 42, "learning-rate": 0.003,
    "save-dtype": "float32",
}  # fmt: skip
VALIDATION_SAMPLES = 200


def demo_assets(tmp: Path) -> tuple[Path, Path, Path]:
    """(model folder, training file, 200-sample validation file) of fresh demo assets."""
    from mini_trainer.demo.assets import DemoSpec, build_demo_assets

    build_demo_assets(tmp, DemoSpec())
    lines = (tmp / "data" / "sort.eval.jsonl").read_text().splitlines()[:VALIDATION_SAMPLES]
    val = tmp / "val200.jsonl"
    val.write_text("\n".join(lines) + "\n")
    return tmp / "model", tmp / "data" / "sort.train.jsonl", val


def throughput(repeats: int) -> None:
    from mini_trainer.distributed.runtime import init_runtime, shutdown
    from mini_trainer.evaluate.runner import evaluate_model
    from mini_trainer.training.loss import make_loss_fn
    from mini_trainer.training.method import make_method
    from mini_trainer.training.model_setup import ModelSpec, build_model
    from mini_trainer.training.validation import Validator
    from mini_trainer.training_args import TrainingArgs

    runtime = init_runtime()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, train, val = demo_assets(Path(tmp))
        args = TrainingArgs(
            model_name_or_path=str(model_dir), data_path=str(train), output_dir=tmp,
            max_tokens_per_gpu=2048, validation_data_path=str(val),
        )  # fmt: skip
        validator = Validator(args, runtime)
        loss_fn = make_loss_fn(False, runtime.device.type)
        model, config = build_model(ModelSpec.of(args), loss_fn, runtime, make_method(args))
        model.train()
        pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        rates = {"inside": [], "evaluate": []}
        for repeat in range(repeats):
            # ABBA order: neither side always runs first (caches, the machine's other jobs).
            if repeat % 2:
                ours = evaluate_model(model_dir, val, runtime, max_tokens_per_gpu=2048)
            inside = validator.evaluate(model, pad_id)
            assert model.training and model.loss_fn is loss_fn  # left as it was
            if not repeat % 2:
                ours = evaluate_model(model_dir, val, runtime, max_tokens_per_gpu=2048)
            assert abs(inside["loss"] - ours["loss"]) <= 1e-5 * ours["loss"]
            rates["inside"].append(inside["tokens_per_second"])
            rates["evaluate"].append(ours["tokens_per_second"])
            print(
                f"run {repeat + 1}: inside training {inside['tokens_per_second']:,.0f} tok/s "
                f"({inside['elapsed_s']:.2f} s), evaluate {ours['tokens_per_second']:,.0f} tok/s "
                f"({ours['elapsed_s']:.2f} s), loss {ours['loss']:.5f}, "
                f"{ours['num_tokens']:,} tokens"
            )
    shutdown()
    inside, evaluate = (statistics.median(rates[k]) for k in ("inside", "evaluate"))
    print(f"median inside training: {inside:,.0f} tokens/s")
    print(f"median evaluate:        {evaluate:,.0f} tokens/s")
    print(f"inside / evaluate: {inside / evaluate:.2f}x; load average {os.getloadavg()}")


def overhead(repeats: int) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, train, val = demo_assets(Path(tmp))
        walls = {"without": [], "with": []}
        val_times = []
        for repeat in range(repeats):
            for side in ("without", "with"):
                out = Path(tmp) / f"{side}{repeat}"
                flags = {**DEMO_TRAINING, "model-name-or-path": model_dir, "data-path": train,
                         "output-dir": out}  # fmt: skip
                if side == "with":
                    flags |= {"validation-data-path": val, "validation-every-steps": 20}
                argv = [sys.executable, "-m", "mini_trainer", "train", "--nproc-per-node", "2"]
                argv += [str(x) for key, value in flags.items() for x in (f"--{key}", value)]
                started = time.perf_counter()
                subprocess.run(argv, check=True, env=env, cwd=REPO, capture_output=True)
                wall = time.perf_counter() - started
                walls[side].append(wall)
                rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
                validated = [r for r in rows if "val_loss" in r]
                val_time = sum(r["val_time_s"] for r in validated)
                if side == "with":
                    val_times.append(val_time)
                print(
                    f"run {repeat + 1} {side} validation: {wall:.1f} s wall, "
                    f"{len(rows)} steps, {len(validated)} validations ({val_time:.1f} s)"
                )
    without, with_val = (statistics.median(walls[k]) for k in ("without", "with"))
    print(f"median wall without validation: {without:.1f} s")
    print(f"median wall with validation:    {with_val:.1f} s")
    print(
        f"overhead: {with_val - without:+.1f} s ({(with_val / without - 1) * 100:+.1f}%); "
        f"median summed val_time_s {statistics.median(val_times):.1f} s; "
        f"load average {os.getloadavg()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("throughput", "overhead"))
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.part == "throughput":
        import torch

        torch.set_num_threads(args.threads)
        throughput(args.repeats or 5)
    else:
        overhead(args.repeats or 2)


if __name__ == "__main__":
    main()
