"""Pruning states, clean-up of interrupted saves, and the metrics rewind (which state a resume
picks: tests/test_run_folder.py)."""

from __future__ import annotations

import json

from mini_trainer.training.checkpoint import (
    TRAINER_STATE,
    _prune_states,
    remove_stale_temp_dirs,
)
from mini_trainer.training.metrics import truncate_metrics


def make_state(root, step, trainer_state='{"progress": {}}', metadata=True):
    path = root / "state" / f"step_{step}"
    path.mkdir(parents=True)
    if trainer_state is not None:
        (path / TRAINER_STATE).write_text(trainer_state)
    if metadata:
        (path / ".metadata").write_bytes(b"dcp")
    return path


def test_prune_keeps_the_newest(tmp_path):
    for step in (2, 4, 6, 8):
        make_state(tmp_path, step)
    _prune_states(tmp_path / "state", keep=2)
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["step_6", "step_8"]


def test_stale_temporary_folders_are_removed(tmp_path):
    leftovers = [
        tmp_path / ".final.tmp-1",
        tmp_path / "hf_format" / ".samples_64.tmp-2",
        tmp_path / "state" / ".step_3.tmp-3",
    ]
    for path in leftovers:
        path.mkdir(parents=True)
    kept = make_state(tmp_path, 3)
    (tmp_path / "hf_format" / "samples_32").mkdir()
    remove_stale_temp_dirs(tmp_path)
    assert not any(path.exists() for path in leftovers)
    assert kept.exists() and (tmp_path / "hf_format" / "samples_32").exists()


def test_metrics_rewind_drops_later_and_torn_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": step, "loss": 1.0}) for step in (1, 2, 3, 4)]
    path.write_text("\n".join(rows) + '\n{"step": 5, "lo\x00\x00')
    truncate_metrics(path, last_step=2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
