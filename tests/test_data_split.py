"""`split-validation`: a seeded, deterministic validation split that never takes an eval sample."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli

from mini_trainer.data.split import choose_validation


def write_samples(path, ids_list, blank_at=()):
    lines = []
    for i, ids in enumerate(ids_list):
        if i in blank_at:
            lines.append("")
        lines.append(json.dumps({"input_ids": ids, "labels": ids}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_choice_is_seeded_sized_and_skips_excluded_and_blank():
    keys = [bytes([i]) for i in range(20)] + [None]
    chosen = choose_validation(keys, {bytes([3]), bytes([4])}, 0.25, seed=1)
    assert len(chosen) == 5  # ceil(0.25 x 18 eligible)
    assert not {3, 4, 20} & set(chosen.tolist())
    assert list(chosen) == sorted(chosen)
    assert list(choose_validation(keys, set(), 0.25, seed=1)) == list(
        choose_validation(keys, set(), 0.25, seed=1)
    )
    assert list(choose_validation(keys, set(), 0.25, seed=1)) != list(
        choose_validation(keys, set(), 0.25, seed=2)
    )


def test_split_files_partition_the_training_file(tmp_path):
    samples = [[i, i + 1, i + 2] for i in range(40)]
    data = write_samples(tmp_path / "train.jsonl", samples, blank_at=(7,))
    evals = write_samples(tmp_path / "eval.jsonl", [samples[0], samples[1], [999]])
    out_train, out_val = tmp_path / "t.jsonl", tmp_path / "v.jsonl"
    flags = ["--fraction", "0.2", "--seed", "5", "--exclude", evals,
             "--out-train", out_train, "--out-validation", out_val]  # fmt: skip
    result = run_cli("split-validation", data, *flags, check=True)
    assert "(33 lines)" in result.stdout and "(8 lines)" in result.stdout  # 41 lines in all
    original = data.read_text().splitlines()
    train_lines, val_lines = out_train.read_text().splitlines(), out_val.read_text().splitlines()
    assert sorted(train_lines + val_lines) == sorted(original)  # byte for byte, nothing lost
    assert [line for line in original if line in train_lines] == train_lines  # order kept
    assert [line for line in original if line in val_lines] == val_lines
    val_ids = [json.loads(line)["input_ids"] for line in val_lines]
    assert samples[0] not in val_ids and samples[1] not in val_ids and "" not in val_lines
    first = out_val.read_text()
    again = run_cli("split-validation", data, *flags, "--force", check=True)
    assert again.returncode == 0 and out_val.read_text() == first  # deterministic


@pytest.mark.parametrize(
    ("fraction", "expected"),
    [("0", "--fraction: must be between 0 and 1"), ("1.0", "--fraction: must be between 0 and 1"),
     ("0.999", "both need at least one")],
)  # fmt: skip
def test_bad_fraction_is_one_line_and_writes_nothing(tmp_path, fraction, expected):
    data = write_samples(tmp_path / "train.jsonl", [[1], [2], [3]])
    out_train, out_val = tmp_path / "t.jsonl", tmp_path / "v.jsonl"
    result = run_cli("split-validation", data, "--fraction", fraction,
                     "--out-train", out_train, "--out-validation", out_val)  # fmt: skip
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert expected in line
    assert not out_train.exists() and not out_val.exists()


def test_a_bad_line_is_file_and_line(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"input_ids": [1], "labels": [1]}\nnot json\n')
    result = run_cli("split-validation", data, "--fraction", "0.5",
                     "--out-train", tmp_path / "t", "--out-validation", tmp_path / "v")  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {data}:2: input_ids: not a JSON object with input_ids"
