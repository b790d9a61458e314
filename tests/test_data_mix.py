"""`mini-trainer mix`: weighted mixtures and replay, deterministic, every sample accounted for."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli

from mini_trainer.data.mix import (
    REPLAY,
    WEIGHT,
    MixInput,
    plan_mix,
    sample_counts,
    sidecar_beside,
    write_mix,
)
from mini_trainer.errors import UserError


def _write(path: Path, name: str, count: int) -> Path:
    """A JSONL file whose line k says which file and line it is."""
    lines = [json.dumps({"src": name, "line": k, "input_ids": [k]}) for k in range(1, count + 1)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def files(tmp_path):
    return {
        "task": _write(tmp_path / "task.jsonl", "task", 60),
        "general": _write(tmp_path / "general.jsonl", "general", 50),
        "old": _write(tmp_path / "old.jsonl", "old", 40),
    }


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------------------------------
# The plan (pure).


def test_counts_follow_the_weights_and_fractions():
    inputs = [
        MixInput(Path("a"), WEIGHT, 3.0),
        MixInput(Path("b"), WEIGHT, 1.0),
        MixInput(Path("c"), REPLAY, 0.25),
    ]
    # a anchors (all 60 once); b is a quarter of the weighted part: 60 * 1/3 = 20; c 10 of 40.
    assert sample_counts(inputs, [60, 50, 40], oversample=False) == [60, 20, 10]
    assert sample_counts(inputs, [60, 50, 2], oversample=False) == [60, 20, 1]  # 0.5 rounds up


def test_plan_is_deterministic_for_a_seed_and_changes_with_it():
    inputs = [MixInput(Path("a"), WEIGHT, 0.9), MixInput(Path("b"), WEIGHT, 0.1)]
    first = plan_mix(inputs, [900, 5000], seed=7)
    assert np.array_equal(first, plan_mix(inputs, [900, 5000], seed=7))
    assert not np.array_equal(first, plan_mix(inputs, [900, 5000], seed=8))
    shares = Counter(first[:, 0].tolist())
    assert shares == {0: 900, 1: 100}  # b's share of the output is 0.1


def test_every_chosen_sample_appears_once_and_the_anchor_entirely():
    inputs = [
        MixInput(Path("a"), WEIGHT, 1.0),
        MixInput(Path("b"), WEIGHT, 1.0),
        MixInput(Path("c"), REPLAY, 0.5),
    ]
    rows = plan_mix(inputs, [30, 45, 20], seed=0)
    assert len({tuple(r) for r in rows.tolist()}) == len(rows)  # no duplicates
    assert sorted(rows[rows[:, 0] == 0, 1].tolist()) == list(range(30))
    assert Counter(rows[:, 0].tolist()) == {0: 30, 1: 30, 2: 10}


def test_a_larger_replay_fraction_keeps_the_smaller_ones_samples():
    small = plan_mix(
        [MixInput(Path("a"), WEIGHT, 1), MixInput(Path("b"), REPLAY, 0.1)], [5, 200], 3
    )
    large = plan_mix(
        [MixInput(Path("a"), WEIGHT, 1), MixInput(Path("b"), REPLAY, 0.3)], [5, 200], 3
    )
    chosen = {int(s) for p, s in small.tolist() if p == 1}
    assert len(chosen) == 20 and chosen <= {int(s) for p, s in large.tolist() if p == 1}


def test_more_than_the_file_has_is_an_error_unless_oversampling():
    inputs = [MixInput(Path("a"), WEIGHT, 1.0), MixInput(Path("b"), WEIGHT, 3.0)]
    with pytest.raises(UserError, match=r"^b: weight 3.0 needs 30 samples but the file has 7"):
        plan_mix(inputs, [10, 7], seed=0)
    rows = plan_mix(inputs, [10, 7], seed=0, oversample=True)
    repeats = Counter(s for p, s in rows.tolist() if p == 1)
    # 30 = 4 whole passes over 7 samples + 2 more: each sample 4 or 5 times, as even as possible.
    assert sum(repeats.values()) == 30 and set(repeats.values()) == {4, 5}
    assert sorted(repeats.values()).count(5) == 2


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([("a", WEIGHT, 1.0), ("b", WEIGHT, -0.5)], "b: weight -0.5 is negative"),
        ([("a", WEIGHT, 0.0), ("b", WEIGHT, 0.0)], "the weights sum to zero"),
        ([("a", WEIGHT, 0.0), ("b", WEIGHT, 1.0)], "a: weight 0.0: the first input anchors"),
        ([("a", WEIGHT, 1.0), ("b", REPLAY, 1.5)], "b: replay fraction 1.5 is outside [0, 1]"),
        ([("a", WEIGHT, 1.0), ("b", REPLAY, -0.1)], "b: replay fraction -0.1 is outside [0, 1]"),
        ([("b", REPLAY, 0.5)], "at least one --input FILE WEIGHT"),
    ],
)
def test_bad_weights_are_refused(inputs, message):
    items = [MixInput(Path(p), kind, value) for p, kind, value in inputs]
    with pytest.raises(UserError) as raised:
        plan_mix(items, [10] * len(items), seed=0)
    assert len(raised.value.lines) == 1 and message in raised.value.lines[0]


# ---------------------------------------------------------------------------------------------
# Files and the command.


def test_write_mix_copies_lines_and_the_sidecar_names_them(files, tmp_path):
    inputs = [
        MixInput(files["task"], WEIGHT, 0.75),
        MixInput(files["general"], WEIGHT, 0.25),
        MixInput(files["old"], REPLAY, 0.5),
    ]
    out, sidecar = tmp_path / "mix.jsonl", tmp_path / "mix.json"
    record = write_mix(inputs, out, sidecar, seed=1)
    samples = _read(out)
    assert Counter(s["src"] for s in samples) == {"task": 60, "general": 20, "old": 20}
    assert json.loads(sidecar.read_text()) == record
    names = [files["task"].stem, files["general"].stem, files["old"].stem]
    for sample, (position, line) in zip(samples, record["lines"], strict=True):
        assert (sample["src"], sample["line"]) == (names[position], line)
    assert [i["chosen"] for i in record["inputs"]] == [60, 20, 20]
    # Byte for byte: the mixed file's lines are the inputs' lines.
    originals = {n: files[n].read_text().splitlines() for n in files}
    assert all(line in originals[json.loads(line)["src"]] for line in out.read_text().splitlines())
    # The same call again writes the same bytes.
    write_mix(inputs, tmp_path / "again.jsonl", tmp_path / "again.json", seed=1)
    assert (tmp_path / "again.jsonl").read_bytes() == out.read_bytes()


def test_cli_mix_writes_both_files(files, tmp_path):
    out = tmp_path / "out/mix.jsonl"
    result = run_cli(
        "mix", "--input", files["task"], "1", "--replay", files["old"], "0.25",
        "--seed", "3", "--out", out, "--out-sidecar", tmp_path / "out/mix.json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(_read(out)) == 70
    assert "old.jsonl: 10 of 40 samples" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input", "{task}", "1", "--input", "{general}", "-1"], "weight -1.0 is negative"),
        (["--input", "{task}", "0", "--input", "{general}", "0"], "the weights sum to zero"),
        (["--input", "{task}", "1", "--replay", "{old}", "2"], "outside [0, 1]"),
        (["--input", "{task}", "1", "--input", "{tmp}/no.jsonl", "1"], "no.jsonl: no such file"),
    ],
)  # fmt: skip
def test_cli_bad_input_is_one_line_and_exit_2(files, tmp_path, args, message):
    names = {name: str(path) for name, path in files.items()}
    argv = [a.format(tmp=tmp_path, **names) for a in args]
    out = tmp_path / "mix.jsonl"
    result = run_cli("mix", *argv, "--out", out, "--out-sidecar", tmp_path / "mix.json")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr, result.stderr
    assert not out.exists() and not (tmp_path / "mix.json").exists()


def test_cli_blank_line_names_file_and_line(files, tmp_path):
    files["old"].write_text(files["old"].read_text() + "\n{}\n")
    out = tmp_path / "mix.jsonl"
    result = run_cli(
        "mix", "--input", files["task"], "1", "--replay", files["old"], "1",
        "--out", out, "--out-sidecar", tmp_path / "mix.json",
    )  # fmt: skip
    assert result.returncode == 2
    assert f"{files['old']}:41: json: blank line" in result.stderr
    assert not out.exists()


def test_cli_refuses_to_overwrite_without_force(files, tmp_path):
    out = tmp_path / "mix.jsonl"
    out.write_text("mine\n")
    args = [
        "mix",
        "--input",
        files["task"],
        "1",
        "--out",
        out,
        "--out-sidecar",
        tmp_path / "s.json",
    ]
    result = run_cli(*args)
    assert result.returncode == 2 and "already exists" in result.stderr
    assert out.read_text() == "mine\n"
    assert run_cli(*args, "--force").returncode == 0 and len(_read(out)) == 60


# ---------------------------------------------------------------------------------------------
# validate on a mixture names the source line of each problem (the file to fix).


def _samples(path: Path, count: int, bad: dict[int, int] | None = None) -> Path:
    """`count` valid samples; line k in `bad` carries token id `bad[k]` instead."""
    lines = []
    for k in range(1, count + 1):
        ids = [5, 6, (bad or {}).get(k, 7)]
        lines.append(json.dumps({"input_ids": ids, "labels": [-100, *ids[1:]]}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def bad_mixture(tmp_path):
    """A mixture NAME.jsonl with NAME.mix.json beside it; one input line has an id of 9999."""
    task = _samples(tmp_path / "task.jsonl", 30)
    general = _samples(tmp_path / "general.jsonl", 40, bad={17: 9999})
    inputs = [MixInput(task, WEIGHT, 3.0), MixInput(general, WEIGHT, 4.0)]  # all 40 of general
    out = tmp_path / "stage.jsonl"
    record = write_mix(inputs, out, sidecar_beside(out), seed=3)
    bad_line = record["lines"].index([1, 17]) + 1
    return out, general, bad_line


def test_validate_names_the_input_line_behind_a_bad_mixture_line(bad_mixture):
    from mini_trainer.data.validate import build_index

    out, general, bad_line = bad_mixture
    assert sidecar_beside(out) == out.with_name("stage.mix.json")
    with pytest.raises(UserError) as caught:
        build_index(out, 100, 64, progress=False, workers=1)
    first = caught.value.lines[0]
    assert first.startswith(f"{out}:{bad_line}: input_ids[2]: token id 9999 is outside"), first
    assert first.endswith(f" (from {general}:17)"), first


def test_a_bad_mixture_line_met_while_training_names_the_input_line_too(bad_mixture):
    """The training data's own check at read time (a file changed after validation; here a
    model of a smaller vocabulary) names the input line as validate does."""
    from mini_trainer.data.dataset import IndexedJsonlDataset
    from mini_trainer.data.validate import build_index

    out, general, bad_line = bad_mixture
    index = build_index(out, 10_000, 64, progress=False, workers=1)[0]
    dataset = IndexedJsonlDataset(out, index, vocab_size=100)
    sample = int(np.flatnonzero(dataset.line_numbers == bad_line)[0])
    with pytest.raises(UserError) as caught:
        dataset[sample]
    (line,) = caught.value.lines
    assert line.startswith(f"{out}:{bad_line}: input_ids: token id 9999 is outside"), line
    assert line.endswith(f"rerun `mini-trainer validate` (from {general}:17)"), line
    sidecar_beside(out).unlink()  # no sidecar: the mixture's line alone, as before
    with pytest.raises(UserError) as caught:
        dataset[sample]
    assert "(from" not in caught.value.lines[0]


@pytest.mark.parametrize("stale", ["one more line", "no sidecar", "not json"])
def test_a_stale_or_missing_sidecar_names_no_source(bad_mixture, stale):
    from mini_trainer.data.validate import build_index

    out, _, bad_line = bad_mixture
    if stale == "one more line":
        out.write_text(out.read_text() + out.read_text().splitlines()[0] + "\n")
    elif stale == "no sidecar":
        sidecar_beside(out).unlink()
    else:
        sidecar_beside(out).write_text("{")
    with pytest.raises(UserError) as caught:
        build_index(out, 100, 64, progress=False, workers=1)
    first = caught.value.lines[0]
    assert first.startswith(f"{out}:{bad_line}: input_ids[2]: ") and "(from" not in first, first
