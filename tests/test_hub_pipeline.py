"""The pipeline with `model: ORG/NAME`, offline, against a Hugging Face cache built from the demo
model (tests/hf_cache.py): the resolve_model rule, the commit pinned in every job, and reruns
that follow the commit. Its one real run also takes the pipeline's validation keys (the split
rule, training with the validation file, `evaluation.checkpoint: best` scoring best/), so one
Snakemake run serves both claims; their pure logic is unit-tested in
tests/test_pipeline_logic.py, the report's validation columns in tests/test_validation.py."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import make_workdir, subprocess_env
from hf_cache import build_hub_cache, model_files
from test_pipeline import check, planned_jobs, rule_counts, snakemake_command

REPO_ID = "demo-org/tiny-llama"


def hub_config(demo_dir, **overrides) -> dict:
    data = demo_dir / "data"
    # Kept alike on purpose: a config of the shape of test_pipeline.demo_config, for a Hub id.
    config = {
        "model": REPO_ID,
        "tasks": {
            task: {split: str(data / f"{task}.{split}.jsonl") for split in ("train", "eval")}
            for task in ("sort", "sort_desc")
        },
        "stages": ["sort"],
        "launch": {"nproc_per_node": 1},  # a job's cost is start-up; ranks: the Slurm pipeline
        "training": {
            "batch_size": 16,
            "max_tokens_per_gpu": 2048,
            "training_mode": "step",
            "max_steps": 2,
            "save_dtype": "float32",
        },
        "methods": {"sft": {"learning_rates": [0.01]}},
    }
    config.update(overrides)
    return config


def run(workdir, repo, *args, timeout=900):
    return subprocess.run([*snakemake_command(), *args], cwd=workdir, capture_output=True,
                          text=True, env=subprocess_env(**repo.env()), timeout=timeout)  # fmt: skip


@pytest.fixture
def hub_workdir(demo_model, demo_dir, tmp_path):
    repo = build_hub_cache(demo_model, tmp_path / "hf_home")
    return make_workdir(tmp_path / "w", hub_config(demo_dir)), repo


def test_dry_run_resolves_on_the_submitting_host_and_pins_the_commit(hub_workdir):
    workdir, repo = hub_workdir
    commit = (repo.folder / "refs" / "main").read_text()
    result = run(workdir, repo, "-n", "-p")
    counts = rule_counts(planned_jobs(result))
    assert counts["resolve_model"] == 1 and "demo_assets" not in counts
    commands = [line for line in result.stdout.splitlines() if "-m mini_trainer " in line]
    for name in ("validate", "osft-svd", "evaluate", "launch"):
        for line in (c for c in commands if f"mini_trainer {name} " in c):
            if REPO_ID in line:
                assert f"--model-revision {commit}" in line, line
    assert any(f"--model-name-or-path {REPO_ID}" in line for line in commands)


def test_no_cached_copy_stops_the_pipeline_with_one_line(demo_dir, tmp_path, hub_repo):
    workdir = make_workdir(tmp_path / "w", hub_config(demo_dir, model="demo-org/absent"))
    result = run(workdir, hub_repo, "-n")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "config: model: demo-org/absent (revision main): offline" in output
    assert "no cached copy in" in output and "mini-trainer resolve-model" in output
    assert not (workdir / "results").exists()


@pytest.fixture(scope="session")
def hub_run(demo_model, demo_dir, tmp_path_factory):
    """One real run up to the evaluations (base and stage 1), one rank, 4 steps, with a
    validation split of 10%, validation every 2 steps and the best checkpoint evaluated.
    Session scope in group `hub_run` (tests/conftest.py): made once."""
    root = tmp_path_factory.mktemp("hub_run")
    repo = build_hub_cache(demo_model, root / "hf_home")
    config = hub_config(demo_dir, data={"validation_fraction": 0.1},
                        evaluation={"checkpoint": "best"})  # fmt: skip
    config["training"].update(max_steps=4, validation_every_steps=2)
    workdir = make_workdir(root / "w", config)
    check(run(workdir, repo, "--cores", "2", "evaluations"))
    return workdir, repo


@pytest.mark.slow
def test_real_run_splits_validates_and_evaluates_the_best_checkpoint(hub_run, demo_dir):
    workdir, _ = hub_run
    results = workdir / "results"
    kept, drawn = (
        (results / f"data/sort.split.{part}.jsonl").read_text().splitlines()
        for part in ("train", "validation")
    )
    original = (demo_dir / "data/sort.train.jsonl").read_text().splitlines()
    assert sorted(kept + drawn) == sorted(original) and len(drawn) == -(-len(original) // 10)
    (run_folder,) = results.glob("train/sft/lr0.01/stage1/*/")
    args = json.loads((run_folder / "training_args.json").read_text())
    assert args["data_path"].endswith("sort.split.train.jsonl") and args["save_best"] is True
    assert args["validation_data_path"].endswith("sort.split.validation.jsonl")
    rows = [json.loads(line) for line in (run_folder / "metrics.jsonl").read_text().splitlines()]
    validated = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in validated] == [2, 4]
    best = json.loads((run_folder / "best/best_checkpoint.json").read_text())
    assert best["value"] == min(r["val_loss"] for r in validated)
    evaluation = json.loads((results / "eval/sft/lr0.01/stage1/sort.json").read_text())
    assert evaluation["model"].endswith("/best")


@pytest.mark.slow
def test_real_run_then_same_commit_reruns_nothing_and_a_new_one_everything(hub_run):
    workdir, repo = hub_run
    record = (workdir / "results" / "model" / "base.json").read_text()
    first = (repo.folder / "refs" / "main").read_text()
    assert first in record
    again = run(workdir, repo, "-n", "evaluations")
    assert "Nothing to be done" in again.stdout + again.stderr
    files = model_files(repo.folder / "snapshots" / first)
    repo.add_snapshot({**files, "README.md": b"main moved\n"})
    counts = rule_counts(planned_jobs(run(workdir, repo, "-n", "evaluations")))
    assert counts["resolve_model"] == 1 and counts["validate"] == 1
    assert counts["train"] == 1 and counts["evaluate"] == 2 * 1  # base and stage 1, one task
    assert "split_validation" not in counts  # the split depends on the data, not the model


def test_stage_one_is_pinned_and_keyed_by_the_commit(hub_repo, demo_dir, monkeypatch):
    import mini_trainer.pipeline as pipeline
    from mini_trainer.pipeline import hub

    for name, value in hub_repo.env().items():
        monkeypatch.setenv(name, value)
    hub._lookup.cache_clear()
    config = hub_config(demo_dir, stages=["sort", "sort_desc"])
    config.update(launch={"nproc_per_node": 2, "nodes": 1}, data={"on_long": "error"})
    commit = (hub_repo.folder / "refs" / "main").read_text()
    assert pipeline.hub_model(config) == (REPO_ID, commit)
    first = pipeline.training_options(config, "sft", "0.01", 1)
    assert first["model_name_or_path"] == REPO_ID and first["model_revision"] == commit
    assert "model_revision" not in pipeline.training_options(config, "sft", "0.01", 2)
    assert pipeline.model_input(config, REPO_ID) == pipeline.MODEL_RECORD
    assert pipeline.model_flags(config, REPO_ID) == f"--model {REPO_ID} --model-revision {commit}"
    key = pipeline.run_key(config, "sft", "0.01", 1)
    hub._lookup.cache_clear()
    assert pipeline.run_key({**config, "model_revision": "a" * 40}, "sft", "0.01", 1) != key
