"""A real, small continual-learning experiment on the demo assets, end to end on a CPU.

    python scripts/demo_experiment.py [--out results/demo_experiment] [--steps 100]

Full fine-tuning (sft) at several learning rates over the three demo tasks in order (stage i
starts from stage i-1's final checkpoint), every stage's checkpoint and the base model evaluated
on every task, then `mini-trainer report`. Each step is the real command a user would run
(`torchrun ... mini_trainer.train`, `mini-trainer validate/evaluate/report`). It is what made
docs/report.png (with scripts/screenshot_report.sh). Finished outputs are reused on a rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TASKS = ["sort", "sort_desc", "sort_plus1"]


def run(*argv: object) -> None:
    argv = [str(a) for a in argv]
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/demo_experiment"))
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps per stage")
    parser.add_argument("--lrs", default="0.001,0.003,0.01", help="learning rates, comma-separated")
    parser.add_argument("--nproc", type=int, default=2, help="torchrun processes per training job")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    py = sys.executable
    out = args.out
    demo = out / "demo"
    if not (demo / "model").is_dir():
        run(py, "-m", "mini_trainer", "demo-assets", "--out", demo)
    entries: list[dict] = []

    for task in TASKS:
        summary = out / "data" / f"{task}.train.summary.json"
        if not summary.exists():
            run(
                py, "-m", "mini_trainer", "validate", demo / "data" / f"{task}.train.jsonl",
                "--model", demo / "model", "--max-tokens-per-gpu", 2048,
                "--out-index", out / "data" / f"{task}.train.parquet", "--out-summary", summary,
            )  # fmt: skip
        entries.append({"kind": "data_summary", "path": str(summary), "task": task})

    def evaluate(model: Path, result: Path, method, lr, stage: int) -> None:
        for task in TASKS:
            path = result / f"{task}.json"
            if not path.exists():
                run(
                    py, "-m", "mini_trainer", "evaluate", "--model", model,
                    "--data", demo / "data" / f"{task}.eval.jsonl", "--out", path,
                )  # fmt: skip
            entries.append(
                {"kind": "eval", "path": str(path), "method": method, "lr": lr, "stage": stage,
                 "task": task}
            )  # fmt: skip

    evaluate(demo / "model", out / "eval" / "base", None, None, 0)
    for lr in [float(x) for x in args.lrs.split(",")]:
        start = demo / "model"
        for stage, task in enumerate(TASKS, start=1):
            run_dir = out / "train" / "sft" / f"lr{lr:g}" / f"stage{stage}"
            if not (run_dir / "final").is_dir():
                run(
                    py, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", args.nproc, "-m", "mini_trainer.train",
                    "--model-name-or-path", start,
                    "--data-path", demo / "data" / f"{task}.train.jsonl",
                    "--output-dir", run_dir, "--batch-size", 32, "--max-tokens-per-gpu", 2048,
                    "--learning-rate", lr, "--num-warmup-steps", 5, "--lr-scheduler", "cosine",
                    "--training-mode", "step", "--max-steps", args.steps, "--seed", 0,
                    "--save-final-checkpoint",
                )  # fmt: skip
            entries.append(
                {"kind": "run", "path": str(run_dir), "method": "sft", "lr": lr, "stage": stage}
            )
            evaluate(run_dir / "final", out / "eval" / "sft" / f"lr{lr:g}" / f"stage{stage}",
                     "sft", lr, stage)  # fmt: skip
            start = run_dir / "final"

    manifest = out / "manifest.json"
    manifest.write_text(json.dumps({"tasks": TASKS, "entries": entries}, indent=2) + "\n")
    run(py, "-m", "mini_trainer", "report", "--out", out / "report", "--manifest", manifest,
        "--force")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
