"""The pipeline's validation keys, by dry runs: the split rule, the training flags, `best`."""

from __future__ import annotations

import json
import re

import pytest
from test_pipeline import demo_config, make_workdir, planned_jobs, rule_counts, snakemake

pytestmark = pytest.mark.slow  # snakemake start-up


def dry_run(tmp_path, config, *targets):
    workdir = make_workdir(tmp_path / "w", config)
    result = snakemake(workdir, "-n", "-p", "--cores", "2", *targets, timeout=300)
    return result, result.stdout + result.stderr


def test_validation_fraction_splits_trains_on_the_rest_and_evaluates_best(tmp_path):
    config = demo_config(data={"validation_fraction": 0.1},
                         evaluation={"checkpoint": "best"})  # fmt: skip
    config["training"]["validation_every_steps"] = 8
    result, text = dry_run(tmp_path, config)
    counts = rule_counts(planned_jobs(result))
    assert counts["split_validation"] == 2  # one per stage task
    assert "--fraction 0.1 --seed 42 --exclude resources/demo/data/sort.eval.jsonl" in text
    trains = [line for line in text.splitlines() if "mini_trainer launch" in line]
    assert len(trains) == 2
    for line in trains:
        task = "sort_desc" if "stage2" in line else "sort"
        assert f"--data-path results/data/{task}.split.train.jsonl" in line
        assert f"--validation-data-path results/data/{task}.split.validation.jsonl" in line
        assert "--save-best" in line and "--validation-every-steps 8" in line
    evals = re.findall(r"mini_trainer evaluate --model (\S+)", text)
    assert "resources/demo/model" in evals  # the base model is itself
    assert sum(path.endswith("/best") for path in evals) == 2 * 2  # 2 stages x 2 tasks


def test_a_task_validation_file_wins_and_checkpoint_final_needs_none(tmp_path):
    data = "resources/demo/data"
    files = {"train": f"{data}/sort.train.jsonl", "eval": f"{data}/sort.eval.jsonl",
             "validation": f"{data}/sort_plus1.eval.jsonl"}  # fmt: skip
    config = demo_config(tasks={"sort": files}, stages=["sort"])
    result, text = dry_run(tmp_path, config, "trainings")
    assert "split_validation" not in rule_counts(planned_jobs(result))
    assert "--validation-data-path resources/demo/data/sort_plus1.eval.jsonl" in text


@pytest.mark.parametrize(
    ("change", "key"),
    [({"evaluation": {"checkpoint": "best"}}, "evaluation.checkpoint"),
     ({"training_extra": {"early_stopping_patience": 2}},
      "methods.sft.training.early_stopping_patience")],
)  # fmt: skip
def test_validation_keys_without_a_validation_file_fail_at_once(tmp_path, change, key):
    config = demo_config()
    if "training_extra" in change:
        config["training"].update(change["training_extra"])
    else:
        config.update(change)
    result, text = dry_run(tmp_path, config)
    assert result.returncode != 0
    assert key in text and "no validation file for sort, sort_desc" in text, text[-2000:]


@pytest.mark.timeout(1200)  # about 6 min alone on the shared 2 cores; more under load
def test_a_real_run_splits_validates_and_evaluates_the_best_checkpoint(tmp_path):
    """One stage, one method: split, validate, train with validation, evaluate best/, report."""
    from test_pipeline import check

    config = demo_config(stages=["sort"], data={"validation_fraction": 0.1},
                         evaluation={"checkpoint": "best"})  # fmt: skip
    config["training"].update(max_steps=8, validation_every_steps=4)
    config["launch"] = {"nproc_per_node": 1}
    workdir = make_workdir(tmp_path / "w", config)
    check(snakemake(workdir, "--cores", "2"))
    results = workdir / "results"
    kept, drawn = (
        (results / f"data/sort.split.{part}.jsonl").read_text().splitlines()
        for part in ("train", "validation")
    )
    original = (workdir / "resources/demo/data/sort.train.jsonl").read_text().splitlines()
    assert sorted(kept + drawn) == sorted(original) and len(drawn) == -(-len(original) // 10)
    (run,) = results.glob("train/sft/lr0.01/stage1/*/")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val_loss" in r] == [4, 8]
    best = json.loads((run / "best/best_checkpoint.json").read_text())
    evaluation = json.loads((results / "eval/sft/lr0.01/stage1/sort.json").read_text())
    assert evaluation["model"].endswith("/best")
    page = (results / "report/report.html").read_text()
    assert "best val loss" in page and f'<td class="num">{best["step"]}</td>' in page
