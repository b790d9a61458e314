"""`--resume` continues only the same run, from an intact state, and never rewrites the record."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import replace

import pytest
import torch
from helpers import base_flags, read_metrics, train_in_process

from mini_trainer.errors import UserError
from mini_trainer.training.checkpoint import TRAINER_STATE
from mini_trainer.training.fingerprint import (
    MAY_CHANGE_ON_RESUME,
    data_fingerprint,
    differences,
    model_fingerprint,
    options_fingerprint,
    sampled_file_digest,
    validation_fingerprint,
)
from mini_trainer.training.resume import RESUMES_FILE, choose_state, damage, record_start
from mini_trainer.training_args import TrainingArgs


def make_args(**overrides) -> TrainingArgs:
    return TrainingArgs(**{"model_name_or_path": "m", "data_path": "d", "output_dir": "o",
                           **overrides})  # fmt: skip


def fingerprint_of(args, data="x", model="y"):
    return {"options": options_fingerprint(args), "data": {"samples": 1, "file": data,
            "index": "i"}, "model": {"config.json": model}}  # fmt: skip


def test_changed_options_give_one_line_each_and_may_change_ones_none():
    saved = fingerprint_of(make_args())
    now = fingerprint_of(make_args(learning_rate=2e-5, lr_scheduler="cosine", keep_states=5))
    lines = differences(saved, now)
    assert lines == [
        "--learning-rate: the state was saved with 1e-05, this run has 2e-05",
        "--lr-scheduler: the state was saved with 'constant_with_warmup', this run has 'cosine'",
    ]
    assert differences(saved, fingerprint_of(make_args(save_every_steps=3))) == []
    # OSFT options are part of the run.
    with_osft = {"osft": True, "osft_unfreeze_rank_ratio": 0.5}
    osft = fingerprint_of(make_args(**with_osft, osft_rank_mode="adaptive",
                                    osft_target_patterns=["q_proj"]))  # fmt: skip
    assert len(differences(fingerprint_of(make_args(**with_osft)), osft)) == 2
    assert len(differences(saved, osft)) == 4  # --osft, the ratio, the mode, the patterns
    data = differences(saved, fingerprint_of(make_args(), data="other"))
    assert data == ["--data-path: not the data the state was trained on (same number of "
                    "samples, different content)"]  # fmt: skip
    model = differences(saved, fingerprint_of(make_args(), model="other"))
    assert model == ["--model-name-or-path: not the base model the state started from "
                     "(differs in config.json)"]  # fmt: skip


def test_validation_file_is_compared_by_content_not_path(tmp_path):
    first, moved = tmp_path / "val.jsonl", tmp_path / "elsewhere" / "val.jsonl"
    first.write_text('{"input_ids": [1, 2], "labels": [1, 2]}\n')
    moved.parent.mkdir()
    shutil.copy(first, moved)

    def run(path):
        return {**fingerprint_of(make_args(validation_data_path=str(path) if path else None)),
                "validation": validation_fingerprint(path)}  # fmt: skip

    saved = run(first)
    assert differences(saved, run(moved)) == []  # moved, identical: the same run
    moved.write_text('{"input_ids": [1, 3], "labels": [1, 3]}\n')  # same size, edited
    assert differences(saved, run(moved)) == [
        f"--validation-data-path: {moved}: not the validation data the state was saved with "
        f"(different content (then {first}))"
    ]
    assert differences(saved, run(None)) == [
        f"--validation-data-path: the state was saved with the validation file {first}, this "
        "run has none"
    ]
    assert differences(run(None), run(first)) == [
        f"--validation-data-path: the state was saved without a validation file, this run "
        f"has {first}"
    ]
    # A state saved before the content was fingerprinted knows the path only: accepted.
    legacy = {key: value for key, value in saved.items() if key != "validation"}
    legacy["options"] = {**saved["options"], "validation_data_path": str(first)}
    assert differences(legacy, run(moved)) == []


def test_may_change_list_names_real_options():
    names = set(vars(make_args()))
    assert set(MAY_CHANGE_ON_RESUME) <= names


def test_data_fingerprint_tells_files_with_the_same_sample_count_apart(demo_dir, tmp_path):
    from mini_trainer.data.dataset import IndexedJsonlDataset
    from mini_trainer.data.validate import build_index

    prints = {}
    for task in ("sort", "sort_desc"):
        path = demo_dir / "data" / f"{task}.train.jsonl"
        index, _ = build_index(path, 10**6, 10**6)
        prints[task] = data_fingerprint(path, IndexedJsonlDataset(path, index))
    assert prints["sort"]["samples"] == prints["sort_desc"]["samples"]
    assert prints["sort"]["file"] != prints["sort_desc"]["file"]
    # A copy is the same data; one changed byte is not.
    copy = tmp_path / "copy.jsonl"
    shutil.copy(demo_dir / "data" / "sort.train.jsonl", copy)
    assert sampled_file_digest(copy) == prints["sort"]["file"]
    raw = bytearray(copy.read_bytes())
    raw[len(raw) // 2] = ord("7") if raw[len(raw) // 2] != ord("7") else ord("8")
    copy.write_bytes(bytes(raw))
    assert sampled_file_digest(copy) != prints["sort"]["file"]


def test_large_files_are_sampled_and_still_see_size_and_sampled_changes(tmp_path, monkeypatch):
    import mini_trainer.training.fingerprint as fp

    monkeypatch.setattr(fp, "FULL_HASH_BYTES", 1 << 20)
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(8 << 20))
    before = sampled_file_digest(path)
    with open(path, "r+b") as handle:  # inside the first MiB, which is always hashed
        handle.seek(100)
        handle.write(b"changed")
    assert sampled_file_digest(path) != before
    with open(path, "ab") as handle:
        handle.write(b"x")
    assert sampled_file_digest(path) != before


def test_model_fingerprint_covers_config_and_weights(demo_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(demo_dir / "model", model)
    before = model_fingerprint(model)
    assert set(before) == {"config.json", "model.safetensors"}
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-3}))
    assert model_fingerprint(model)["config.json"] != before["config.json"]


# ---------------------------------------------------------------- intact states, real DCP files


def save_state(out, step, world=2):
    """A real (single-process) torch.distributed.checkpoint state with trainer state and RNG."""
    import torch.distributed.checkpoint as dcp

    path = out / "state" / f"step_{step}"
    path.mkdir(parents=True)
    with warnings.catch_warnings():  # "no process group: saving from a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": {"w": torch.arange(4096.0) + step}}, checkpoint_id=str(path))
    (path / TRAINER_STATE).write_text(json.dumps({"progress": {"step": step}}))
    for rank in range(world):
        torch.save({"torch": torch.get_rng_state()}, path / f"rng_rank{rank}.pt")
    return path


def truncate(path, keep=20):
    path.write_bytes(path.read_bytes()[:keep])


def shard_of(state):
    return next(state.glob("*.distcp"))


def test_a_fresh_folder_starts_from_step_0(tmp_path):
    assert choose_state(tmp_path / "missing", None) is None
    (tmp_path / "empty").mkdir()
    assert choose_state(tmp_path / "empty", None) is None


@pytest.mark.parametrize("leftover", ["metrics", "final"])
def test_a_run_without_any_state_is_refused_not_restarted(tmp_path, leftover):
    if leftover == "metrics":
        (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    else:
        (tmp_path / "final").mkdir()
    with pytest.raises(UserError) as error:
        choose_state(tmp_path, None)
    (line,) = error.value.lines
    assert "holds a run" in line and "no saved state" in line
    if leftover == "metrics":
        assert "metrics.jsonl has 2 steps" in line
        assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'


@pytest.mark.parametrize("damaged_file", ["shard", ".metadata", "rng", "trainer_state"])
def test_a_damaged_newest_state_falls_back_to_the_newest_intact_one(tmp_path, damaged_file):
    older = save_state(tmp_path, 2)
    newest = save_state(tmp_path, 4)
    assert damage(newest) is None
    target = {
        "shard": shard_of(newest),
        ".metadata": newest / ".metadata",
        "rng": newest / "rng_rank1.pt",
        "trainer_state": newest / TRAINER_STATE,
    }[damaged_file]
    truncate(target)
    assert damage(newest) is not None
    assert choose_state(tmp_path, None) == older
    # Moved aside: neither picked again nor counted by pruning as the newest state.
    assert not newest.exists() and (tmp_path / "state" / ".damaged-step_4").is_dir()


def test_no_intact_state_is_refused_with_each_reason(tmp_path):
    for step in (2, 4):
        truncate(shard_of(save_state(tmp_path, step)))
    with pytest.raises(UserError) as error:
        choose_state(tmp_path, None)
    lines = error.value.lines
    assert len(lines) == 3 and "step_4: damaged" in lines[0] and "step_2: damaged" in lines[1]
    assert "no intact state" in lines[2]
    assert (tmp_path / "state" / "step_4").is_dir(), "nothing is moved when resume is refused"


def test_resume_appends_a_record_and_keeps_training_args(tmp_path):
    first = make_args(output_dir=str(tmp_path))
    record_start(tmp_path, first, None, 0)
    original = (tmp_path / "training_args.json").read_text()
    record_start(tmp_path, replace(first, keep_states=1, resume=True), tmp_path / "s", 4)
    assert (tmp_path / "training_args.json").read_text() == original
    (record,) = [json.loads(line) for line in (tmp_path / RESUMES_FILE).read_text().splitlines()]
    assert record["step"] == 4 and record["changed"] == {"keep_states": {"was": 2, "now": 1}}


# ---------------------------------------------------------------- end to end


@pytest.mark.slow
def test_resume_refuses_another_run_and_accepts_may_change_options(trained_run, demo_dir, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(trained_run.out, out)
    args_before = (out / "training_args.json").read_text()
    metrics_before = (out / "metrics.jsonl").read_text()

    other = {**trained_run.flags, "learning-rate": 1e-3, "resume": True,
             "data-path": demo_dir / "data" / "sort_desc.train.jsonl"}  # fmt: skip
    result = train_in_process(*base_flags(demo_dir, out, **other))  # one rank, this process
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3, result.stderr
    assert "--learning-rate: the state was saved with 0.003, this run has 0.001" in errors[0]
    assert "--data-path: not the data the state was trained on (same number" in errors[1]
    assert "Traceback" not in result.stderr
    assert (out / "training_args.json").read_text() == args_before
    assert (out / "metrics.jsonl").read_text() == metrics_before

    # Saving more often and keeping fewer states is the same run: it resumes.
    same = {**trained_run.flags, "resume": True, "keep-states": 1}
    result = train_in_process(*base_flags(demo_dir, out, **same))
    assert result.returncode == 0, result.stderr
    assert (out / "training_args.json").read_text() == args_before
    (record,) = [json.loads(line) for line in (out / RESUMES_FILE).read_text().splitlines()]
    assert record["step"] == trained_run.steps
    assert record["changed"]["keep_states"] == {"was": 2, "now": 1}
    assert [row["step"] for row in read_metrics(out)] == list(range(1, trained_run.steps + 1))
