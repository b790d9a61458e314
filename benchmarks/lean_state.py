"""Quality, state size and step time of every `--optimizer` / `--param-dtype` mode against fp32
AdamW, on the CPU (2 ranks under torchrun, gloo, FSDP2).

    python benchmarks/lean_state.py [--steps 300] [--width 512] [--layers 4]
        [--learning-rate 1e-3] [--lr-scheduler cosine] [--seed 7 [8 9 ...]] [--out FILE.json]
    python benchmarks/lean_state.py --from-json FILE.json   # that run's summary again

Each mode trains the same randomly initialised Llama (hidden `--width`, built here, nothing
downloaded) on the demo task `sort_plus1` (`mini-trainer demo-assets`) for `--steps` steps with
the same seed and data order, validating on its held-out file after the last step. Reported per
mode: the mean training loss of the last 50 steps (or the last quarter, if fewer than 200 steps)
and the held-out loss (the evaluator's, `val_loss`), each as a ratio to fp32 AdamW's; the
optimizer state's bytes per trainable parameter, measured by building the mode's real optimizer
over real tensors shaped like rank 0's shards and taking one step (the layout `plan` counts);
and the mean step time after the first 10 steps (torchao's compile), as a ratio to fp32 AdamW's
in the same invocation. Prints the CPU model and the load average: figures taken on a loaded
machine say so.

With several seeds (data orders) every mode runs once per seed, and the summary compares each
mode's mean over the seeds with fp32 AdamW's mean, beside fp32 AdamW's own range over the seeds:
a single 300-step run is one draw of a spread (trajectories part after a few steps), so a 2%
question needs the spread too.

The row `adamw, bf16-rounded start` is the yardstick for that spread: fp32 AdamW again, every
flag the same, started from the model's weights rounded to bf16 (what any bf16 checkpoint
gives). It changes no method, only the start, by about bf16's rounding: its paired ratios show
how far a seed's ratio moves when nothing but rounding-sized noise differs, and the summary's
`+-` is the standard error of each paired mean over the seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from plan import child_env  # noqa: E402  (benchmarks/plan.py: this script's directory)

ROUNDED_START = "adamw, bf16-rounded start"
"""fp32 AdamW from the weights rounded to bf16: the spread of a paired ratio (docstring)."""
MODES = {
    "adamw": (),
    "adamw-bf16": ("--optimizer", "adamw-bf16"),
    "adamw, bf16 params": ("--param-dtype", "bf16"),
    "adamw-bf16, bf16 params": ("--optimizer", "adamw-bf16", "--param-dtype", "bf16"),
    "adamw-8bit": ("--optimizer", "adamw-8bit"),
    "adamw-8bit, bf16 params": ("--optimizer", "adamw-8bit", "--param-dtype", "bf16"),
    ROUNDED_START: (),
}
RANKS = 2


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def make_model(work: Path, width: int, layers: int) -> tuple[Path, Path]:
    """(model folder, demo data folder): a Llama of the given width with the demo tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    demo = work / "demo"
    if not (demo / "model").is_dir():
        subprocess.run(
            [sys.executable, "-m", "mini_trainer", "demo-assets", "--out", str(demo)],
            check=True, env=child_env(), capture_output=True,
        )  # fmt: skip
    model = work / f"llama-{width}x{layers}"
    if not (model / "model.safetensors").is_file():
        base = json.loads((demo / "model" / "config.json").read_text())
        config = LlamaConfig(
            hidden_size=width, intermediate_size=width * 8 // 3 // 64 * 64,
            num_hidden_layers=layers, num_attention_heads=width // 64, num_key_value_heads=
            max(1, width // 128), head_dim=64, vocab_size=base["vocab_size"],
            max_position_embeddings=base["max_position_embeddings"], tie_word_embeddings=False,
            bos_token_id=base["bos_token_id"], eos_token_id=base["eos_token_id"],
            pad_token_id=base["pad_token_id"], use_cache=False,
        )  # fmt: skip
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(model)
        for path in (demo / "model").iterdir():
            if "token" in path.name or path.name.endswith(".jinja"):
                shutil.copy(path, model / path.name)
    return model, demo / "data"


def rounded_start(model: Path) -> Path:
    """A copy of `model` whose weights are rounded to bf16 and stored in fp32 again."""
    import torch
    from safetensors.torch import load_file, save_file

    rounded = model.with_name(model.name + "-bf16-rounded")
    if not (rounded / "model.safetensors").is_file():
        shutil.copytree(model, rounded, dirs_exist_ok=True)
        weights = load_file(model / "model.safetensors")
        weights = {k: v.to(torch.bfloat16).float() for k, v in weights.items()}
        save_file(weights, rounded / "model.safetensors", metadata={"format": "pt"})
    return rounded


def train(
    model: Path,
    data: Path,
    out: Path,
    steps: int,
    mode: tuple,
    lr: float,
    seed: int,
    scheduler: str = "constant_with_warmup",
) -> list[dict]:
    shutil.rmtree(out, ignore_errors=True)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
        str(RANKS), "-m", "mini_trainer.train", "--model-name-or-path", str(model),
        "--data-path", str(data / "sort_plus1.train.jsonl"), "--output-dir", str(out),
        "--validation-data-path", str(data / "sort_plus1.eval.jsonl"),
        "--validation-every-steps", str(steps), "--training-mode", "step",
        "--max-steps", str(steps), "--batch-size", "16", "--max-tokens-per-gpu", "512",
        "--learning-rate", str(lr), "--num-warmup-steps", "10", "--lr-scheduler", scheduler,
        "--seed", str(seed), *mode,
    ]  # fmt: skip
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=7200)
    if done.returncode:
        raise SystemExit(f"{mode}: training failed\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def state_bytes_per_param(model: Path, mode: tuple) -> float:
    """Rank 0's optimizer-state bytes per trainable element of its shards, measured on the
    mode's real optimizer after one real step over tensors shaped like those shards."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from mini_trainer.plan.optimizer_state import shard_like, tensor_bytes
    from mini_trainer.training.optimizer import optimizer_class
    from mini_trainer.training_args import parse_training_args

    args = parse_training_args(["--model-name-or-path", "m", "--data-path", "d",
                                "--output-dir", "o", *mode])  # fmt: skip
    dtype = torch.bfloat16 if args.param_dtype == "bf16" else torch.float32
    with torch.device("meta"):
        full = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))
    shards = [
        torch.randn(shard_like(p, RANKS, dtype).shape).to(dtype).requires_grad_()
        for p in full.parameters()
    ]
    optimizer = optimizer_class(args)(shards, lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                                      weight_decay=0.0)  # fmt: skip
    for shard in shards:
        shard.grad = torch.randn_like(shard)
    optimizer.step()
    state = sum(tensor_bytes(v) for s in optimizer.state.values() for v in s.values())
    return state / sum(s.numel() for s in shards)


def summarize(rows: list[dict], names: list[str]) -> list[dict]:
    """Per mode: the mean of each figure over its seeds, its lowest and highest seed, each mean as
    a ratio to fp32 AdamW's (the first mode), and the paired ratios: the mode's loss over fp32
    AdamW's at the same seed (the same batches), their mean, lowest and highest."""
    fp32 = {r["seed"]: r for r in rows if r["mode"] == names[0]}
    summary = []
    for name in names:
        runs = [r for r in rows if r["mode"] == name]
        row = {"mode": name, "flags": runs[0]["flags"], "seeds": [r["seed"] for r in runs],
               "state_bytes_per_param": runs[0]["state_bytes_per_param"]}  # fmt: skip
        for key in ("last_loss", "val_loss", "step_time_s"):
            values = [r[key] for r in runs]
            row[key], row[f"{key}_min"], row[f"{key}_max"] = (
                statistics.fmean(values), min(values), max(values))  # fmt: skip
        for key in ("last_loss", "val_loss"):
            paired = [r[key] / fp32[r["seed"]][key] for r in runs]
            row[f"{key}_paired"] = statistics.fmean(paired)
            row[f"{key}_paired_min"], row[f"{key}_paired_max"] = min(paired), max(paired)
            spread = statistics.stdev(paired) if len(paired) > 1 else 0.0
            row[f"{key}_paired_se"] = spread / len(paired) ** 0.5
        summary.append(row)
    base = summary[0]
    for row in summary:
        row["last_loss_ratio"] = row["last_loss"] / base["last_loss"]
        row["val_loss_ratio"] = row["val_loss"] / base["val_loss"]
        row["state_ratio"] = row["state_bytes_per_param"] / base["state_bytes_per_param"]
        row["step_time_ratio"] = row["step_time_s"] / base["step_time_s"]
    return summary


def print_summary(summary: list[dict]) -> None:
    print(f"{'mode':26s} {'last loss':>9s} {'ratio':>6s} {'range':>13s} {'paired':>26s} "
          f"{'val loss':>9s} {'ratio':>6s} {'range':>13s} {'paired':>26s} {'state B/param':>13s} "
          f"{'ratio':>6s} {'step s':>7s} {'ratio':>6s}")  # fmt: skip
    for row in summary:
        print(f"{row['mode']:26s} {row['last_loss']:9.4f} {row['last_loss_ratio']:6.3f} "
              f"{row['last_loss_min']:6.4f}-{row['last_loss_max']:6.4f} "
              f"{row['last_loss_paired']:6.3f}+-{row['last_loss_paired_se']:5.3f} "
              f"({row['last_loss_paired_min']:5.3f}-"
              f"{row['last_loss_paired_max']:5.3f}) "
              f"{row['val_loss']:9.4f} {row['val_loss_ratio']:6.3f} "
              f"{row['val_loss_min']:6.4f}-{row['val_loss_max']:6.4f} "
              f"{row['val_loss_paired']:6.3f}+-{row['val_loss_paired_se']:5.3f} "
              f"({row['val_loss_paired_min']:5.3f}-"
              f"{row['val_loss_paired_max']:5.3f}) "
              f"{row['state_bytes_per_param']:13.3f} {row['state_ratio']:6.3f} "
              f"{row['step_time_s']:7.3f} {row['step_time_ratio']:6.2f}", flush=True)  # fmt: skip
    print(f"means over the seeds {summary[0]['seeds']}; ratio: a mode's mean over fp32 AdamW's "
          "mean (same invocation); range: its lowest and highest seed; paired: the mean of its "
          "ratios to fp32 AdamW at the same seed +- its standard error (lowest-highest); "
          f"'{ROUNDED_START}': fp32 AdamW from bf16-rounded weights, the spread a paired "
          "ratio has when no method differs")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--lr-scheduler", default="constant_with_warmup",
                        help="train's --lr-scheduler (cosine: the rate decays to 0 by the last "
                        "step, so the final weights are annealed)")  # fmt: skip
    parser.add_argument(
        "--seed",
        type=int,
        nargs="+",
        default=[7],
        help="data orders (the model is fixed); several: a run per mode and seed",
    )
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="Write the rows as JSON too.")
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="Print the summary of an earlier run's --out file (no training).",
    )
    options = parser.parse_args()
    if options.from_json:
        runs = json.loads(options.from_json.read_text())["runs"]
        print_summary(summarize(runs, list(dict.fromkeys(r["mode"] for r in runs))))
        return
    work = options.work or Path(tempfile.mkdtemp(prefix="lean-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model, data = make_model(work, options.width, options.layers)
    tail = 50 if options.steps >= 200 else max(1, options.steps // 4)
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; CPU: {cpu_model()}, {os.cpu_count()} cores; "
          f"load average before: {os.getloadavg()}")  # fmt: skip
    print(f"{RANKS} ranks, Llama hidden {options.width} x {options.layers} layers, "
          f"{options.steps} steps, learning rate {options.learning_rate} "
          f"({options.lr_scheduler}), seeds {options.seed}; "
          f"last-{tail}-step mean loss")  # fmt: skip
    names = ["adamw", *[m for m in options.modes if m != "adamw"]]
    starts = {name: rounded_start(model) if name == ROUNDED_START else model for name in names}
    state = {name: state_bytes_per_param(model, MODES[name]) for name in names}
    rows = []
    for seed in options.seed:
        for name in names:
            started = time.perf_counter()
            metrics = train(starts[name], data, work / f"run-{name.replace(', ', '-')}-s{seed}",
                            options.steps, MODES[name], options.learning_rate, seed,
                            options.lr_scheduler)  # fmt: skip
            rows.append({
                "mode": name,
                "seed": seed,
                "flags": list(MODES[name]),
                "last_loss": statistics.fmean(r["loss"] for r in metrics[-tail:]),
                "val_loss": next(r["val_loss"] for r in reversed(metrics) if "val_loss" in r),
                "step_time_s": statistics.fmean(r["step_time_s"] for r in metrics[10:] or metrics),
                "state_bytes_per_param": state[name],
                "wall_s": time.perf_counter() - started,
            })  # fmt: skip
            print(f"seed {seed} {name:26s} last {rows[-1]['last_loss']:.4f} "
                  f"val {rows[-1]['val_loss']:.4f} step {rows[-1]['step_time_s']:.3f} s "
                  f"({rows[-1]['wall_s']:.0f} s)", flush=True)  # fmt: skip
            if options.out:  # after every run: a stopped benchmark keeps what it measured
                options.out.write_text(json.dumps({"runs": rows}, indent=2) + "\n")
    summary = summarize(rows, names)
    print_summary(summary)
    print(f"load average after: {os.getloadavg()}")
    if options.out:
        options.out.write_text(json.dumps({"runs": rows, "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
