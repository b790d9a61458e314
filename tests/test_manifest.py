"""`mini-trainer manifest`: the report's manifest in the format docs/evaluate.md shows."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli


def _args(out, *extra):
    return (
        "manifest", "--out", out, "--task", "sort", "--task", "sort_desc",
        "--eval", "results/eval/base/sort.json", "-", "-", "0", "sort",
        "--eval", "results/eval/sft/lr0.01/stage1/sort_desc.json", "sft", "0.01", "1", "sort_desc",
        "--run", "results/train/sft/lr0.01/stage1/0123456789", "sft", "0.01", "1",
        "--data-summary", "results/data/sort.train.summary.json", "sort",
        *extra,
    )  # fmt: skip


def test_manifest_lists_every_entry_with_its_cell(tmp_path):
    out = tmp_path / "manifest.json"
    run_cli(*_args(out), check=True)
    assert json.loads(out.read_text()) == {
        "tasks": ["sort", "sort_desc"],
        "entries": [
            {"kind": "eval", "path": "results/eval/base/sort.json", "method": None,
             "lr": None, "stage": 0, "task": "sort"},
            {"kind": "eval", "path": "results/eval/sft/lr0.01/stage1/sort_desc.json",
             "method": "sft", "lr": 0.01, "stage": 1, "task": "sort_desc"},
            {"kind": "run", "path": "results/train/sft/lr0.01/stage1/0123456789",
             "method": "sft", "lr": 0.01, "stage": 1},
            {"kind": "data_summary", "path": "results/data/sort.train.summary.json",
             "task": "sort"},
        ],
    }  # fmt: skip


def test_manifest_refuses_to_replace_without_force(tmp_path):
    out = tmp_path / "manifest.json"
    out.write_text("mine")
    result = run_cli(*_args(out))
    assert result.returncode == 2
    assert f"{out}: already exists" in result.stderr
    assert out.read_text() == "mine"
    run_cli(*_args(out, "--force"), check=True)
    assert json.loads(out.read_text())["tasks"] == ["sort", "sort_desc"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--eval", "e.json", "sft", "-", "0", "sort"), "the base model is METHOD - LR - STAGE 0"),
        (("--eval", "e.json", "sft", "0.01", "0", "sort"), "STAGE of a trained checkpoint"),
        (("--eval", "e.json", "sft", "0.01", "3", "sort"), "stage 3 but only 2 tasks"),
        (("--eval", "e.json", "sft", "fast", "1", "sort"), "LR must be a number"),
        (("--eval", "e.json", "sft", "0.01", "1", "other"), "task 'other' is not a --task"),
        (("--eval", "e.json", "sft", "0.01", "1", "sort_desc"), "two entries for the same cell"),
        (("--run", "r", "sft", "0.01", "x"), "STAGE must be an integer"),
        (("--task", "sort"), "a task is given twice"),
    ],
)
def test_manifest_refuses_ambiguous_entries(tmp_path, extra, message):
    out = tmp_path / "manifest.json"
    result = run_cli(*_args(out, *extra))
    assert result.returncode == 2
    assert message in result.stderr
    assert not out.exists()
