"""Every subcommand checks its output location before any work: an unwritable one is one line,
exit 2, and nothing is computed or left behind (a read-only tmpfs: root ignores chmod)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from helpers import REPO_ROOT, base_flags, run_cli

TRACE = REPO_ROOT / "tests" / "fixtures" / "trace"

SUBCOMMANDS = [
    "demo-assets", "validate", "tokenize", "osft-svd", "train", "launch", "evaluate", "report",
    "manifest", "resolve-model", "split-validation", "mix", "ewc-fisher", "interpolate",
    "generate", "trace-chat", "trace-score",
]  # fmt: skip


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder no one can write into, root included; unmounted by its path afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a read-only tmpfs (chmod does not stop root)")
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def _command(subcommand, demo_dir, tmp_path, ro):
    model, data = demo_dir / "model", demo_dir / "data" / "sort.eval.jsonl"
    chat = tmp_path / "chat.jsonl"
    turns = [{"role": "user", "content": "1 2"}, {"role": "assistant", "content": "2 3"}]
    chat.write_text(json.dumps({"messages": turns}) + "\n")
    train = base_flags(demo_dir, ro / "run")
    return {
        "demo-assets": ["--out", ro / "demo"],
        "validate": [data, "--model", model, "--max-tokens-per-gpu", 512,
                     "--out-index", ro / "i.parquet", "--out-summary", ro / "s.json"],
        "tokenize": [chat, "--model", model, "--out", ro / "t.jsonl"],
        "osft-svd": ["--model", model, "--out", ro / "svd"],
        "train": train,
        "launch": ["--nproc-per-node", 2, "--", *train],
        "evaluate": ["--model", model, "--data", data, "--out", ro / "e.json"],
        "report": ["--out", ro / "report", data],
        "manifest": ["--out", ro / "m.json", "--task", "sort"],
        "resolve-model": ["--model", model, "--out", ro / "model.json"],
        "split-validation": [data, "--fraction", 0.1, "--out-train", ro / "t.jsonl",
                             "--out-validation", ro / "v.jsonl"],
        "mix": ["--input", data, 1.0, "--out", ro / "mix.jsonl", "--out-sidecar", ro / "m.json"],
        "ewc-fisher": ["--model", model, "--data", demo_dir / "data" / "sort.train.jsonl",
                       "--out", ro / "fisher"],
        "interpolate": ["--previous", model, "--new", model, "--alpha", 0.5,
                        "--out", ro / "wise"],
        "generate": ["--model", model, "--data", chat, "--out", ro / "answers.jsonl"],
        "trace-chat": [TRACE / "FOMC" / "train.json", "--out", ro / "fomc.jsonl"],
        "trace-score": ["--task", "FOMC", "--data", TRACE / "FOMC" / "test.json",
                        "--predictions", chat, "--out", ro / "score.json"],
    }[subcommand]  # fmt: skip


def test_the_list_is_every_subcommand():
    from mini_trainer.cli import cli

    assert set(SUBCOMMANDS) <= set(cli.commands)
    assert set(cli.commands) - set(SUBCOMMANDS) <= {"plan"}  # plan writes only to stdout


@pytest.mark.parametrize("subcommand", SUBCOMMANDS)
def test_an_unwritable_output_is_one_line_before_any_work(
    demo_dir, tmp_path, read_only_dir, subcommand
):
    result = run_cli(subcommand, *_command(subcommand, demo_dir, tmp_path, read_only_dir))
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines()
             if line and not line.startswith("mini-trainer launch (")]  # fmt: skip
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {read_only_dir}"), lines[0]
    assert lines[0].endswith("cannot write there (Read-only file system)"), lines[0]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["chat.jsonl", "ro"]
