"""The same command twice on one machine gives the same bytes: the exported weights, every
metric but the measured ones (time, speed, memory: `MEASURED_FIELDS`), and the evaluation's
JSON; `--deterministic` changes nothing on the CPU.

In-process one-rank runs (the cheap way); the pipeline through Slurm (tests/slurm/) compares its
weights and evaluations with a local pipeline run's, each job a process of its own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers import base_flags, read_metrics, run_cli, train_in_process

from mini_trainer.training.metrics import MEASURED_FIELDS


def computed(row: dict) -> dict:
    """A metrics row or an evaluation without its measured fields."""
    return {key: value for key, value in row.items() if key not in MEASURED_FIELDS}


def outputs(out: Path, eval_data: Path | None) -> dict:
    """What two runs must agree on: final/'s files, the metrics, the export's evaluation."""
    found = {
        "final": {p.name: p.read_bytes() for p in sorted((out / "final").iterdir())},
        "metrics": [computed(row) for row in read_metrics(out)],
    }
    if eval_data is not None:
        evaluation = out / "eval.json"
        run_cli("evaluate", "--model", out / "final", "--data", eval_data, "--out", evaluation,
                "--max-tokens-per-gpu", "512", check=True)  # fmt: skip
        found["evaluation"] = computed(json.loads(evaluation.read_text()))
    return found


def test_the_same_command_twice_gives_the_same_bytes(demo_dir, tmp_path):
    eval_data = tmp_path / "eval.jsonl"
    lines = (demo_dir / "data" / "sort_plus1.eval.jsonl").read_text().splitlines(keepends=True)
    eval_data.write_text("".join(lines[:8]))
    out = tmp_path / "run"  # the same path each time: the same command
    flags = base_flags(demo_dir, out, **{"training-mode": "step", "max-steps": 2,
                                         "save-final-checkpoint": True})  # fmt: skip
    runs = []
    for extra, evaluated in (([], eval_data), ([], eval_data), (["--deterministic"], None)):
        assert train_in_process(*flags, *extra).returncode == 0
        runs.append(outputs(out, evaluated))
        shutil.rmtree(out)
    first, again, deterministic = runs
    assert len(first["metrics"]) == 2 and "model.safetensors" in first["final"]
    assert first["evaluation"]["num_samples"] == 8
    assert again == first
    del first["evaluation"]
    # The CPU meaning of --deterministic: the same bytes (its training_args.json records it).
    args, first_args = (json.loads(run["final"].pop("training_args.json"))
                        for run in (deterministic, first))  # fmt: skip
    assert (args.pop("deterministic"), first_args.pop("deterministic")) == (True, False)
    assert args == first_args and deterministic == first
