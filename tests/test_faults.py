"""Faults that must end in one line, not a traceback: unwritable outputs, a full disk, weights
that do not load or do not fit the config; and outputs that others can read (mode 644)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess

import pytest
from helpers import base_flags, run_cli, train_in_process

from mini_trainer.errors import UserError
from mini_trainer.io_utils import current_umask


@contextlib.contextmanager
def tmpfs(path, options):
    """A tmpfs mounted at `path` for the block (root ignores chmod: only a mount is real)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_validate_and_tokenize_refuse_a_read_only_output_before_scanning(demo_dir, tmp_path):
    data = demo_dir / "data" / "sort.train.jsonl"
    chat = tmp_path / "chat.jsonl"
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    chat.write_text(json.dumps({"messages": turns}) + "\n")
    with tmpfs(tmp_path / "ro", "ro,size=1m") as read_only:
        result = run_cli(
            "validate", data, "--model", demo_dir / "model", "--max-tokens-per-gpu", 512,
            "--out-index", read_only / "i.parquet", "--out-summary", tmp_path / "s.json",
        )  # fmt: skip
        assert result.returncode == 2
        assert result.stderr.splitlines() == [
            f"error: {read_only}: --out-index: cannot write there (Read-only file system)"
        ]
        result = run_cli("tokenize", chat, "--model", demo_dir / "model",
                         "--out", read_only / "sub" / "t.jsonl")  # fmt: skip
        assert result.returncode == 2
        assert result.stderr.splitlines() == [
            f"error: {read_only / 'sub'}: --out: cannot write there (Read-only file system)"
        ]
    assert not (tmp_path / "s.json").exists()


NO_STATE_ADVICE = (
    "partial files removed; no state was saved, so the run cannot continue: make room and run "
    "again with --resume auto, which keeps this attempt aside and starts over"
)


def assert_one_line_without_a_state(demo_dir, out, flags: dict, writing: str) -> None:
    """A run (in this process) that fills the disk writing `writing` before any state was saved
    exits 2 with that one line and no traceback."""
    result = train_in_process(*base_flags(demo_dir, out, **flags))
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert errors == [f"error: {out}: writing {writing} failed: No space left on device "
                      f"({NO_STATE_ADVICE})"], result.stderr  # fmt: skip
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_full_disk_during_a_state_save_is_one_line_and_leaves_no_partial_folder(
    demo_dir, tmp_path
):
    with tmpfs(tmp_path / "small", "size=6m") as small:
        out = small / "run"
        flags = {"training-mode": "step", "max-steps": 2, "save-every-steps": 1}
        # No state was saved before: --resume would refuse the folder, so it is not the advice.
        assert_one_line_without_a_state(demo_dir, out, flags, "state/step_1")
        leftovers = [p.name for p in (out / "state").iterdir()] if (out / "state").exists() else []
        assert leftovers == []


@pytest.mark.slow
def test_a_full_disk_on_two_ranks_is_one_line_from_every_rank_and_resume_continues(
    demo_dir, tmp_path
):
    """The first state fits, the second does not: DCP raises on both ranks; neither prints a
    traceback (rank 1 used to, when rank 0's clean-up freed the disk before rank 1 probed it);
    one line advises --resume, which continues after making room."""
    from helpers import read_metrics, run_launcher

    with tmpfs(tmp_path / "small", "size=15m") as small:
        out = small / "run"
        flags = base_flags(demo_dir, out, **{"training-mode": "step", "max-steps": 3,
                                             "save-every-steps": 1})  # fmt: skip
        result = run_launcher(*flags)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr + result.stdout, result.stderr
        errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
        assert errors == [f"error: {out}: writing state/step_2 failed: No space left on device "
                          "(partial files removed; the states already saved are kept: make room "
                          "and run again with --resume)"], result.stderr  # fmt: skip
        assert sorted(p.name for p in (out / "state").iterdir()) == ["step_1"]
        subprocess.run(["mount", "-o", "remount,size=64m", str(small)], check=True)
        again = train_in_process(*flags, "--resume")  # one rank, in this process: it continues
        assert again.returncode == 0, again.stderr
        assert [row["step"] for row in read_metrics(out)] == [1, 2, 3]


@pytest.mark.slow
def test_a_full_disk_writing_final_without_a_state_advises_what_the_next_command_accepts(
    demo_dir, tmp_path
):
    with tmpfs(tmp_path / "small", "size=2m") as small:
        out = small / "run"
        flags = {"training-mode": "step", "max-steps": 1, "save-final-checkpoint": True}
        assert_one_line_without_a_state(demo_dir, out, flags, "final")
        assert not (out / "final").exists()


def _model_copy(demo_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(demo_dir / "model", model)
    return model


def _load(model):
    """Build the training model from `model` in a world of one process, as `train` does."""
    from mini_trainer.distributed.runtime import init_runtime, shutdown
    from mini_trainer.method import FullFineTuning
    from mini_trainer.training.loss import make_loss_fn
    from mini_trainer.training.model_setup import ModelSpec, build_model

    runtime = init_runtime()
    try:
        spec = ModelSpec(str(model))
        return build_model(spec, make_loss_fn(False, "cpu"), runtime, FullFineTuning())
    finally:
        shutdown()


def test_truncated_weights_are_one_line(demo_dir, tmp_path):
    model = _model_copy(demo_dir, tmp_path)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(UserError) as error:
        _load(model)
    (line,) = error.value.lines
    assert line.startswith(f"{model / 'model.safetensors'}: "), line
    assert "truncated" in line or "not a readable safetensors file" in line, line


@pytest.mark.parametrize(
    ("layers", "expected"),
    [(3, "9 checkpoint tensors not in the config"), (5, "9 weights missing from the checkpoint")],
)
def test_weights_that_do_not_fit_the_config_are_refused(demo_dir, tmp_path, layers, expected):
    model = _model_copy(demo_dir, tmp_path)
    config = json.loads((model / "config.json").read_text())
    assert config["num_hidden_layers"] == 4
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    with pytest.raises(UserError) as error:
        _load(model)
    (line,) = error.value.lines
    assert f"the weights do not match config.json: {expected}: model.layers" in line, line


def test_weights_of_another_shape_are_refused(demo_dir, tmp_path):
    model = _model_copy(demo_dir, tmp_path)
    config = json.loads((model / "config.json").read_text())
    config_other = {**config, "intermediate_size": config["intermediate_size"] * 2}
    (model / "config.json").write_text(json.dumps(config_other))
    with pytest.raises(UserError, match="shape .* but the model expects"):
        _load(model)


def test_exported_weights_are_readable_by_others(demo_dir, trained_run):
    expected = 0o666 & ~current_umask()
    for path in (demo_dir / "model" / "model.safetensors",
                 trained_run.out / "final" / "model.safetensors",
                 trained_run.out / "final" / "config.json"):  # fmt: skip
        assert stat.S_IMODE(os.stat(path).st_mode) == expected, path
