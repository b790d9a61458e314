"""Validation during training: the tracker's rules, the options' checks, and real runs.

The end-to-end tests share one 2-rank run (`validated_run`: the `trained_run` fixture's flags
plus validation), so "validation changes nothing else" compares it with that run bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from helpers import base_flags, read_metrics, run_cli, run_launcher, train_in_process
from safetensors.torch import load_file

from mini_trainer.errors import UserError
from mini_trainer.training.validation import (
    VAL_METRICS,
    VAL_ROW_FIELDS,
    BestTracker,
    best_metadata,
    validation_due,
)
from mini_trainer.training_args import TrainingArgs, parse_training_args

# ----------------------------------------------------------------------------- pure rules


def feed(tracker: BestTracker, values, first_step: int = 1) -> list[bool]:
    return [tracker.update(step, v) for step, v in enumerate(values, start=first_step)]


def test_tracker_lower_is_better_with_min_delta_and_patience():
    tracker = BestTracker(mode="min", min_delta=0.1, patience=2)
    assert feed(tracker, [2.0, 1.95, 1.5, 1.45, 1.41]) == [True, False, True, False, False]
    assert (tracker.best_value, tracker.best_step) == (1.5, 3)
    assert tracker.bad_validations == 2 and tracker.should_stop


def test_tracker_higher_is_better_and_nan_never_improves():
    tracker = BestTracker(mode="max", patience=None)
    assert not tracker.update(1, float("nan")) and tracker.best_text().startswith("none yet")
    tracker = BestTracker(mode="max", patience=None)
    assert feed(tracker, [0.2, float("nan"), 0.2, 0.3]) == [True, False, False, True]
    assert tracker.best_text() == "0.3 at step 4"
    assert (tracker.best_value, tracker.best_step) == (0.3, 4)
    assert not tracker.should_stop  # no patience: never stops, however many bad validations


def test_tracker_state_round_trip_decides_as_an_uninterrupted_run():
    values = [3.0, 2.0, 2.5, 2.4, 1.0, 1.2, 1.3]
    straight = BestTracker(mode="min", patience=3)
    decisions = feed(straight, values)
    first = BestTracker(mode="min", patience=3)
    feed(first, values[:3])
    saved = json.loads(json.dumps(first.state_dict()))  # as trainer_state.json keeps it
    resumed = BestTracker(mode="min", patience=3)
    resumed.load_state_dict(saved)
    assert decisions[:3] + feed(resumed, values[3:], first_step=4) == decisions
    assert resumed == straight


@pytest.mark.parametrize(
    ("step", "every", "last", "due"),
    [(4, 2, False, True), (3, 2, False, False), (3, 2, True, True), (5, None, False, False),
     (5, None, True, True)],
)  # fmt: skip
def test_validation_is_due_every_n_steps_and_after_the_last(step, every, last, due):
    assert validation_due(step, every, last) is due


def test_metric_directions():
    assert VAL_METRICS["val_loss"] == VAL_METRICS["val_perplexity"] == "min"
    assert VAL_METRICS["val_token_accuracy"] == VAL_METRICS["val_exact_match"] == "max"


# ----------------------------------------------------------------------------- bad input

ARGS = {"model_name_or_path": "m", "data_path": "d", "output_dir": "o"}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"save_best": True}, "--save-best: needs --validation-data-path"),
        ({"best_metric": "val_exact_match"}, "--best-metric: needs --validation-data-path"),
        ({"early_stopping_patience": 3}, "--early-stopping-patience: needs --validation-data-path"),
        ({"validation_data_path": "v", "best_metric": "val_bleu"},
         "--best-metric: unknown value 'val_bleu' (one of val_loss, val_perplexity, "
         "val_token_accuracy, val_exact_match)"),
        ({"validation_data_path": "v", "early_stopping_patience": 0},
         "--early-stopping-patience: must be at least 1, got 0"),
        ({"validation_data_path": "v", "early_stopping_min_delta": -0.1},
         "--early-stopping-min-delta: must be a finite number >= 0, got -0.1"),
        ({"validation_data_path": "v", "validation_every_steps": 0},
         "--validation-every-steps: must be at least 1, got 0"),
    ],
)  # fmt: skip
def test_bad_validation_options_are_one_line_each(extra, expected):
    with pytest.raises(UserError) as error:
        TrainingArgs(**ARGS, **extra)
    assert error.value.lines == [expected]


def test_bad_validation_flags_exit_2_before_training(demo_dir, tmp_path, capsys):
    from mini_trainer.train import main

    out = tmp_path / "out"
    flags = base_flags(demo_dir, out, **{"early-stopping-patience": 2})
    assert main(flags) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --early-stopping-patience: needs --validation-data-path"
    )
    missing = tmp_path / "nope.jsonl"
    assert main(base_flags(demo_dir, out, **{"validation-data-path": missing})) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {missing}: --validation-data-path: no such file"
    )
    assert not out.exists()


@pytest.mark.slow
def test_invalid_validation_file_is_file_line_and_exit_2(demo_dir, tmp_path):
    lines = (demo_dir / "data/sort.eval.jsonl").read_text().splitlines()[:3]
    broken = json.loads(lines[1])
    broken["labels"] = broken["labels"][:-1]  # one label short of its input_ids
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], json.dumps(broken), lines[2]]) + "\n")
    out = tmp_path / "out"
    flags = base_flags(demo_dir, out, **{"validation-data-path": bad, "max-steps": 1,
                                          "training-mode": "step"})  # fmt: skip
    result = train_in_process(*flags)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    # The training data's own report (the same code checks both): one problem is one line.
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(f"error: {bad}:2: labels: "), result.stderr
    assert not out.exists()  # refused before anything was written: no `.lock`-only folder
    # A sample over the validation cap names the validation's own flag, twice.
    flags += ["--validation-data-path", demo_dir / "data/sort.eval.jsonl",
              "--validation-max-tokens-per-gpu", "8"]  # fmt: skip
    result = train_in_process(*flags)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "more than --validation-max-tokens-per-gpu 8" in errors[0], result.stderr
    assert "raise --validation-max-tokens-per-gpu to at least" in errors[-1], result.stderr
    assert "--max-tokens-per-gpu" not in result.stderr.replace("--validation-max", ""), errors
    assert not out.exists()


def test_the_training_file_as_validation_file_is_warned_about(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"input_ids": [1], "labels": [1]}\n')
    copy = tmp_path / "copy.jsonl"
    shutil.copy(data, copy)
    args = TrainingArgs(**{**ARGS, "data_path": str(data)}, save_final_checkpoint=True)
    for same in (data, copy):
        (warning,) = dataclasses.replace(args, validation_data_path=str(same)).warnings()
        assert "--validation-data-path is the training file" in warning
    other = tmp_path / "other.jsonl"
    other.write_text('{"input_ids": [2], "labels": [2]}\n')
    assert dataclasses.replace(args, validation_data_path=str(other)).warnings() == []
    # best/ holds weights: no "no weights will be written" warning with --save-best alone
    best_only = TrainingArgs(**{**ARGS, "data_path": str(data)}, validation_data_path=str(other),
                             save_best=True)  # fmt: skip
    assert best_only.warnings() == []


def test_validation_flags_parse():
    argv = ["--model-name-or-path", "m", "--data-path", "d", "--output-dir", "o",
            "--validation-data-path", "v", "--validation-every-steps", "20",
            "--validation-max-tokens-per-gpu", "4096", "--save-best", "--best-metric",
            "val_token_accuracy", "--early-stopping-patience", "3",
            "--early-stopping-min-delta", "0.01"]  # fmt: skip
    args = parse_training_args(argv)
    assert (args.validation_every_steps, args.validation_max_tokens_per_gpu) == (20, 4096)
    assert args.save_best and args.best_metric == "val_token_accuracy"
    assert (args.early_stopping_patience, args.early_stopping_min_delta) == (3, 0.01)


# ----------------------------------------------------------------------------- real runs

VALIDATION = {"validation-every-steps": 2, "save-best": True}


def evaluate(model, data, out_json) -> dict:
    """`mini-trainer evaluate` itself, on one rank."""
    run_cli("evaluate", "--model", model, "--data", data, "--out", out_json,
            "--max-tokens-per-gpu", 512, check=True)  # fmt: skip
    return json.loads(out_json.read_text())


@pytest.fixture(scope="module")
def validated_run(demo_dir, trained_run, tmp_path_factory):
    """`trained_run`'s 2-rank run again, validating on sort_plus1's eval file every 2 steps."""
    import types

    out = tmp_path_factory.mktemp("validated") / "run"
    val_data = demo_dir / "data" / "sort_plus1.eval.jsonl"
    flags = {**trained_run.flags, **VALIDATION, "validation-data-path": val_data}
    result = run_launcher(*base_flags(demo_dir, out, **flags))
    if result.returncode != 0:
        raise AssertionError(f"training failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return types.SimpleNamespace(out=out, flags=flags, val_data=val_data, result=result)


@pytest.mark.slow
def test_validation_changes_no_weight(validated_run, trained_run):
    with_val = load_file(validated_run.out / "final" / "model.safetensors")
    without = load_file(trained_run.out / "final" / "model.safetensors")
    assert with_val.keys() == without.keys()
    for key in without:
        assert torch.equal(with_val[key], without[key]), key
    rows, plain = read_metrics(validated_run.out), read_metrics(trained_run.out)
    assert [r["loss"] for r in rows] == [r["loss"] for r in plain]


@pytest.mark.slow
def test_val_rows_equal_evaluate_of_the_exported_checkpoints(validated_run, tmp_path):
    rows = read_metrics(validated_run.out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    validated = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in validated] == [2, 4]
    for row in validated:
        assert set(VAL_ROW_FIELDS) <= row.keys()
        assert row["val_tokens"] > 0 and row["val_time_s"] > 0
    final = evaluate(validated_run.out / "final", validated_run.val_data, tmp_path / "f.json")
    last = validated[-1]
    assert last["val_loss"] == pytest.approx(final["loss"], rel=1e-5)
    assert last["val_token_accuracy"] == pytest.approx(final["token_accuracy"], rel=1e-5)
    assert last["val_exact_match"] == final["exact_match"]
    assert last["val_tokens"] == final["num_tokens"]

    best_row = min(validated, key=lambda r: r["val_loss"])
    meta = best_metadata(validated_run.out / "best")
    assert (meta["step"], meta["metric"]) == (best_row["step"], "val_loss")
    assert meta["value"] == best_row["val_loss"]
    best = evaluate(validated_run.out / "best", validated_run.val_data, tmp_path / "b.json")
    assert best["loss"] == pytest.approx(best_row["val_loss"], rel=1e-5)
    assert "val_loss" in validated_run.result.stdout + validated_run.result.stderr
    state = json.loads((validated_run.out / "state/step_4/trainer_state.json").read_text())
    assert state["validation"]["best_step"] == best_row["step"]


@pytest.mark.slow
def test_resume_with_validation_ends_as_the_uninterrupted_run(demo_dir, validated_run, tmp_path):
    # A crash after step 4's row and best/ export, before its state: resume from step 2.
    killed = tmp_path / "killed"
    shutil.copytree(validated_run.out, killed)
    shutil.rmtree(killed / "state" / "step_4")
    shutil.rmtree(killed / "final")
    flags = {**validated_run.flags, "resume": True}
    result = run_launcher(*base_flags(demo_dir, killed, **flags))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "resumed from" in result.stderr
    straight, resumed = read_metrics(validated_run.out), read_metrics(killed)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(straight, resumed, strict=True):
        assert a.keys() == b.keys()
        for key in ("loss", "grad_norm", *VAL_METRICS, "val_tokens"):
            assert a.get(key) == b.get(key), (a["step"], key)
    a = load_file(validated_run.out / "final" / "model.safetensors")
    b = load_file(killed / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (
        best_metadata(killed / "best")["step"] == best_metadata(validated_run.out / "best")["step"]
    )


@pytest.mark.slow
def test_early_stopping_is_a_normal_finish_on_one_rank(demo_dir, tmp_path):
    out = tmp_path / "run"
    val_data = demo_dir / "data" / "sort_plus1.eval.jsonl"
    flags = {
        "training-mode": "step", "max-steps": 50, "save-final-checkpoint": True,
        "validation-data-path": val_data, "validation-every-steps": 1, "save-best": True,
        "early-stopping-patience": 2, "early-stopping-min-delta": 100,
    }  # fmt: skip
    result = train_in_process(*base_flags(demo_dir, out, **flags))  # one rank, this process
    assert result.returncode == 0, result.stderr[-4000:]
    stops = [line for line in result.stderr.splitlines() if "early stopping" in line]
    assert len(stops) == 1 and "after step 3" in stops[0], result.stderr[-2000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all("val_loss" in r for r in rows)
    assert best_metadata(out / "best")["step"] == 1
    final = evaluate(out / "final", val_data, tmp_path / "f.json")
    assert rows[-1]["val_loss"] == pytest.approx(final["loss"], rel=1e-5)
    best = evaluate(out / "best", val_data, tmp_path / "b.json")
    assert rows[0]["val_loss"] == pytest.approx(best["loss"], rel=1e-5)


# ----------------------------------------------------------------------------- report


def synthetic_run(folder, val_losses: dict[int, float], best_metric="val_loss", best_step=None):
    """A run folder as training writes it: 6 steps, val_* on the steps of `val_losses`."""
    folder.mkdir(parents=True)
    rows = []
    for step in range(1, 7):
        row = {"step": step, "epoch": 0, "loss": 2.0 / step, "lr": 1e-3,
               "tokens_per_second": 1000.0}  # fmt: skip
        if step in val_losses:
            row |= {"val_loss": val_losses[step], "val_token_accuracy": 1 / val_losses[step]}
        rows.append(json.dumps(row))
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    (folder / "training_args.json").write_text(json.dumps({"best_metric": best_metric}))
    if best_step is not None:
        (folder / "best").mkdir()
        (folder / "best" / "best_checkpoint.json").write_text(json.dumps({"step": best_step}))
    return folder


def test_report_best_validation_step(tmp_path):
    from mini_trainer.report.inputs import read_run

    losses = {2: 1.5, 4: 1.2, 6: 1.3}
    assert read_run(synthetic_run(tmp_path / "a", losses)).best_validation() == (4, 1.2)
    # best/'s own step wins (the tracker's min-delta may keep an earlier step)
    kept = synthetic_run(tmp_path / "b", losses, best_step=2)
    assert read_run(kept).best_validation() == (2, 1.5)
    # a higher-is-better metric picks its own best step; the mark sits on the val_loss curve
    accuracy = synthetic_run(tmp_path / "c", {2: 1.5, 4: 2.0}, "val_token_accuracy")
    assert read_run(accuracy).best_validation() == (2, 1.5)
    assert read_run(synthetic_run(tmp_path / "d", {})).best_validation() is None


def test_report_plots_validation_next_to_training_loss(tmp_path):
    import re

    validated = synthetic_run(tmp_path / "runs" / "validated", {2: 1.5, 4: 1.2, 6: 1.3})
    plain = synthetic_run(tmp_path / "runs" / "plain", {})
    out = tmp_path / "report"
    run_cli("report", "--out", out, validated, plain, check=True)
    page = (out / "report.html").read_text()
    cells = {
        name: re.findall(r"<td[^>]*>(.*?)</td>", row)
        for name, row in re.findall(r"<tr><td>[^<]*/(validated|plain)</td>(.*?)</tr>", page)
    }
    assert cells["validated"][2:4] == ["1.2", "4"]  # best val loss, best step
    assert cells["plain"][2:4] == ["none", "none"]  # no validation: says so, not "missing"
    assert "best val loss" in page and (out / "training_runs.png").is_file()
