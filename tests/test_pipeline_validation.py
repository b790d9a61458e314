"""The pipeline's validation keys in a real Snakemake run: the split rule, training with the
validation file, and `evaluation.checkpoint: best` scoring best/.

The pure logic (paths, flags, inputs, config checks) is unit-tested in
tests/test_pipeline_logic.py, the report's validation columns in tests/test_validation.py.
"""

from __future__ import annotations

import json

import pytest
from helpers import make_workdir
from test_pipeline import check, demo_config, snakemake

pytestmark = pytest.mark.slow  # snakemake, torchrun


@pytest.mark.timeout(1200)  # a few minutes alone on the shared 2 cores; more under load
def test_a_real_run_splits_validates_and_evaluates_the_best_checkpoint(tmp_path):
    """One stage, one method, one rate, one rank, 4 steps; up to the stage's evaluation (the
    base model's evaluation, manifest and report add nothing validation-specific)."""
    config = demo_config(stages=["sort"], data={"validation_fraction": 0.1},
                         evaluation={"checkpoint": "best"})  # fmt: skip
    config["training"].update(batch_size=8, max_steps=4, validation_every_steps=2)
    config["launch"] = {"nproc_per_node": 1}
    workdir = make_workdir(tmp_path / "w", config)
    target = "results/eval/sft/lr0.01/stage1/sort.json"
    check(snakemake(workdir, "--cores", "2", target))
    results = workdir / "results"
    kept, drawn = (
        (results / f"data/sort.split.{part}.jsonl").read_text().splitlines()
        for part in ("train", "validation")
    )
    original = (workdir / "resources/demo/data/sort.train.jsonl").read_text().splitlines()
    assert sorted(kept + drawn) == sorted(original) and len(drawn) == -(-len(original) // 10)
    (run,) = results.glob("train/sft/lr0.01/stage1/*/")
    args = json.loads((run / "training_args.json").read_text())
    assert args["data_path"].endswith("sort.split.train.jsonl") and args["save_best"] is True
    assert args["validation_data_path"].endswith("sort.split.validation.jsonl")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    validated = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in validated] == [2, 4]
    best = json.loads((run / "best/best_checkpoint.json").read_text())
    assert best["value"] == min(r["val_loss"] for r in validated)
    evaluation = json.loads((workdir / target).read_text())
    assert evaluation["model"].endswith("/best")
