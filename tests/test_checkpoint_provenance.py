"""Every exported model folder says where it came from: `training_args.json` inside it."""

from __future__ import annotations

import json

import pytest
from helpers import train_in_process

from mini_trainer.training.run_folder import Kind, classify

pytestmark = pytest.mark.slow


def test_checkpoints_carry_their_training_args_and_states_drop_after_final(demo_dir, tmp_path):
    lines = (demo_dir / "data/sort.train.jsonl").read_text().splitlines()[:32]
    data = tmp_path / "small.jsonl"
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    result = train_in_process(  # one rank, in this process
        "--model-name-or-path", demo_dir / "model", "--data-path", data, "--output-dir", out,
        "--batch-size", 16, "--max-tokens-per-gpu", 512, "--learning-rate", 1e-3,
        "--training-mode", "step", "--max-steps", 2, "--min-samples-per-checkpoint", 16,
        "--save-final-checkpoint", "--save-every-steps", 1, "--drop-states-after-final",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # The pipeline's flag: the states written at steps 1 and 2 are gone once final/ is
    # published, and the folder is a finished run (run_folder.py), its exports kept.
    assert not (out / "state").exists() and not list(out.glob(".state.tmp-*"))
    assert classify(out).kind is Kind.FINISHED
    assert "saved training state" in result.stderr and "dropped the run's training" in result.stderr
    # the default saves in the background here (a tiny state), and says why at the start
    assert "async save: on (default: the staged copy, " in result.stderr
    run_args = json.loads((out / "training_args.json").read_text())
    assert run_args["model_name_or_path"] == str(demo_dir / "model")
    folders = [out / "hf_format" / "samples_16", out / "hf_format" / "samples_32", out / "final"]
    for folder in folders:
        assert json.loads((folder / "training_args.json").read_text()) == run_args, folder
