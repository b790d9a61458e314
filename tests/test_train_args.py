"""Training arguments: one clear line per bad argument, and the API forwards every field."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import pytest
from helpers import REPO_ROOT, subprocess_env

from mini_trainer.api_train import TrainingFailed, build_command, run_training
from mini_trainer.launch_args import TorchrunArgs, split_launcher_args
from mini_trainer.methods import METHOD_NAMES, METHODS
from mini_trainer.training_args import (
    SCHEDULERS,
    TrainingArgs,
    _base_type,
    parse_training_args,
    to_cli_args,
)


def run_train_module(*flags, **env):
    return subprocess.run(
        [sys.executable, "-m", "mini_trainer.train", *map(str, flags)],
        capture_output=True, text=True, env=subprocess_env(**env), cwd=REPO_ROOT, timeout=300,
    )  # fmt: skip


@pytest.fixture
def good_flags(demo_dir, tmp_path):
    return [
        "--model-name-or-path", demo_dir / "model",
        "--data-path", demo_dir / "data/sort.train.jsonl",
        "--output-dir", tmp_path / "out",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "env", "expected"),
    [
        (["--osft", "--osft-unfreeze-rank-ratio", "1.5"], {},
         "--osft-unfreeze-rank-ratio: must be in [0, 1], got 1.5"),
        (["--lr-scheduler", "warp"], {}, "--lr-scheduler: unknown value 'warp'"),
        (["--batch-size", "1"], {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"},
         "--batch-size: 1 is smaller than the number of ranks (2)"),
        (["--context-parallel", "2"], {"WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0"},
         "--context-parallel: 2 does not divide the number of ranks (3)"),
        (["--context-parallel", "2", "--batch-size", "1"],
         {"WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "0"},
         "--batch-size: 1 is smaller than the number of context-parallel groups (2)"),
        (["--training-mode", "step"], {}, "--max-steps: required with --training-mode step"),
        (["--max-tokens-per-gpu", "0"], {}, "--max-tokens-per-gpu: must be at least 1, got 0"),
        # argparse's own errors: one line too, not its 40-line usage.
        (["--training-method", "osft"], {}, "unrecognized arguments: --training-method osft"),
        (["--batch-size", "abc"], {}, "argument --batch-size: invalid int value: 'abc'"),
        (["--lr-scheduler"], {}, "argument --lr-scheduler: expected one argument"),
    ],
)  # fmt: skip
def test_bad_arguments_give_one_clear_line(good_flags, extra, env, expected, capsys, monkeypatch):
    from mini_trainer.train import main

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(list(map(str, [*good_flags, *extra]))) == 2  # in-process: no start-up to pay
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"error: {expected}"] or (
        len(lines) == 1 and lines[0].startswith(f"error: {expected}")
    ), lines


def test_missing_data_file_is_named(demo_dir, tmp_path):
    missing = tmp_path / "nope.jsonl"
    result = run_train_module(
        "--model-name-or-path", demo_dir / "model", "--data-path", missing,
        "--output-dir", tmp_path / "out",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {missing}: --data-path: no such file"
    assert not (tmp_path / "out").exists()


def test_existing_run_is_not_overwritten(good_flags, tmp_path, capsys):
    from mini_trainer.train import main

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(list(map(str, good_flags))) == 2
    assert "already holds a training run" in capsys.readouterr().err
    assert (tmp_path / "out" / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_train_help_is_the_same_through_the_cli():
    from helpers import run_cli

    via_cli = run_cli("train", "--help", check=True).stdout
    via_module = run_train_module("--help").stdout
    assert "--max-tokens-per-gpu" in via_cli
    assert via_cli.split("options:")[1] == via_module.split("options:")[1]


def _non_default(field: dataclasses.Field, kind: type):
    """A value for `field` that differs from its default."""
    if kind is bool:
        return True
    if kind is list:
        return ["q_proj", "v_proj"]
    if field.name == "lr_scheduler":
        return "cosine"
    if field.name == "training_mode":
        return "step"
    if field.name == "save_dtype":
        return "float16"
    if field.name == "osft_rank_mode":
        return "adaptive"
    if field.name == "best_metric":
        return "val_exact_match"
    if field.name == "optimizer":
        return "adamw-bf16"  # adamw-8bit is refused with --async-save (set here)
    if field.name == "param_dtype":
        return "fp32"  # bf16 is refused with --osft (set here): tests/test_lean_state.py
    if field.name == "context_parallel":
        return 1  # refused with --osft and --compile (set here): tests/test_context_parallel.py
    if kind is float:
        return 0.25 if field.default in (None, dataclasses.MISSING) else field.default / 2 + 0.125
    if kind is int:
        return 3 if field.default in (None, dataclasses.MISSING) else field.default + 3
    return f"value-of-{field.name}"


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_every_training_field_is_forwarded(method):
    """Every shared option and every option of one method (options of two methods at once are
    refused: tests/test_methods.py), set to other than its default, comes back from the
    launcher's command line."""
    hints = typing.get_type_hints(TrainingArgs)
    group = METHODS[method]
    others = {f.name for g in METHODS.values() if g is not group for f in g.own_fields()}
    fields = [f for f in dataclasses.fields(TrainingArgs) if f.name not in others]
    values = {f.name: _non_default(f, _base_type(hints[f.name])) for f in fields}
    values["method"] = method
    args = TrainingArgs(**values)
    for f in fields:
        kept = ("param_dtype", "context_parallel")
        unchanged = f.name in kept or (f.name == "method" and method == "sft")
        assert unchanged or getattr(args, f.name) != f.default, f.name
    command = build_command(TorchrunArgs(nproc_per_node=2), args)
    torchrun, train_argv = split_launcher_args(command[command.index("train") + 1 :])
    assert parse_training_args(train_argv) == args
    assert torchrun == TorchrunArgs(nproc_per_node=2)


def test_defaults_round_trip():
    args = TrainingArgs(model_name_or_path="m", data_path="d", output_dir="o")
    assert parse_training_args(to_cli_args(args)) == args


@pytest.mark.slow
def test_run_training_api(demo_dir, tmp_path, monkeypatch):
    for key, value in subprocess_env().items():
        monkeypatch.setenv(key, value)
    args = TrainingArgs(
        model_name_or_path=str(demo_dir / "model"),
        data_path=str(demo_dir / "data/sort_desc.train.jsonl"),
        output_dir=str(tmp_path / "api"),
        batch_size=8, max_tokens_per_gpu=512, training_mode="step", max_steps=3,
        save_final_checkpoint=True,
    )  # fmt: skip
    run_training(TorchrunArgs(nproc_per_node=1), args, echo=False)
    assert (tmp_path / "api" / "final" / "config.json").is_file()
    assert len((tmp_path / "api" / "metrics.jsonl").read_text().splitlines()) == 3

    bad = dataclasses.replace(args, output_dir=str(tmp_path / "bad"), max_tokens_per_gpu=8)
    with pytest.raises(TrainingFailed) as failure:
        run_training(TorchrunArgs(nproc_per_node=1), bad, echo=False)
    assert failure.value.returncode == 2  # the launcher's documented status for a user error
    tail = "".join(failure.value.tail)
    assert "more than --max-tokens-per-gpu 8" in tail
    # One hint, naming commands that exist: validate --on-long drop, then train --data-index.
    assert tail.count("--on-long drop") == 1 and "train with --data-index F.parquet" in tail
    assert "Traceback" not in tail


@pytest.mark.parametrize("name", SCHEDULERS)
def test_every_accepted_scheduler_builds(name):
    import torch
    from transformers import get_scheduler

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = get_scheduler(name, optimizer, num_warmup_steps=2, num_training_steps=10)
    for _ in range(10):
        optimizer.step()
        scheduler.step()
    assert len(scheduler.get_last_lr()) == 1


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--osft-svd-cache", "svd"], "--osft-svd-cache: needs --osft"),
        (["--osft-rank-mode", "adaptive"], "--osft-rank-mode: needs --osft"),
        (["--seed", "-1"], "--seed: must be >= 0, got -1"),
        (["--learning-rate", "-1e-3"], "--learning-rate: must be a finite number >= 0, got -0.001"),
        (["--weight-decay", "-1"], "--weight-decay: must be >= 0, got -1.0"),
        (["--training-mode", "step", "--max-steps", "5", "--num-warmup-steps", "10"],
         "--num-warmup-steps: 10 is more than --max-steps 5"),
    ],
)  # fmt: skip
def test_bad_values_are_named_not_parsed_as_flags(extra, expected):
    from mini_trainer.errors import UserError

    with pytest.raises(UserError) as error:
        parse_training_args(["--model-name-or-path", "m", "--data-path", "d", "--output-dir", "o",
                             *extra])  # fmt: skip
    assert len(error.value.lines) == 1 and error.value.lines[0].startswith(expected)


def test_help_marks_required_flags_defaults_and_osft_dependencies():
    from mini_trainer.training_args import build_parser

    parser = build_parser()
    helps = {action.option_strings[0]: action.help for action in parser._actions}
    for flag in ("--model-name-or-path", "--data-path", "--output-dir"):
        assert helps[flag].endswith("(required)"), flag
    assert helps["--batch-size"].endswith("(default: 32)")
    osft = [flag for flag in helps if flag.startswith("--osft-")]
    assert len(osft) >= 5 and all("Needs --osft." in helps[flag] for flag in osft)
    assert "Exit status: 0 done; 2 bad input" in " ".join(parser.format_help().split())


def test_a_run_that_writes_no_weights_is_warned_about():
    plain = TrainingArgs(model_name_or_path="m", data_path="d", output_dir="o")
    (warning,) = plain.warnings()
    assert "no weights will be written" in warning and "--save-final-checkpoint" in warning
    for flag in ("save_final_checkpoint", "checkpoint_at_epoch"):
        assert dataclasses.replace(plain, **{flag: True}).warnings() == []
