"""The index-backed dataset returns each line's data exactly and refuses a stale index."""

from __future__ import annotations

import json
import multiprocessing
import pickle
import shutil

import numpy as np
import pytest
from helpers import run_cli

from mini_trainer.data.dataset import IndexedJsonlDataset
from mini_trainer.data.validate import build_index, read_vocab_size, write_index
from mini_trainer.errors import UserError


@pytest.fixture(scope="module")
def vocab(demo_model) -> int:
    return read_vocab_size(demo_model)


@pytest.fixture(scope="module")
def validated(demo_dir, demo_model, tmp_path_factory):
    """A demo data file and its index, written once by the real CLI."""
    out = tmp_path_factory.mktemp("validated")
    data, index = demo_dir / "data" / "sort_plus1.eval.jsonl", out / "index.parquet"
    run_cli(
        "validate", data, "--model", demo_model, "--max-tokens-per-gpu", 512,
        "--out-index", index, "--out-summary", out / "summary.json", check=True,
    )  # fmt: skip
    return data, index


@pytest.fixture
def indexed(validated, tmp_path):
    """A private copy of the validated data and its index, free to be modified."""
    data, index = tmp_path / "data.jsonl", tmp_path / "index.parquet"
    shutil.copy(validated[0], data)
    shutil.copy(validated[1], index)
    return data, index


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_returns_each_line_exactly(indexed):
    data, index = indexed
    rows = _rows(data)
    dataset = IndexedJsonlDataset.open(data, index)
    assert len(dataset) == len(rows)
    for i, row in enumerate(rows):
        assert dataset[i] == {"input_ids": row["input_ids"], "labels": row["labels"]}
    assert dataset[-1]["input_ids"] == rows[-1]["input_ids"]
    with pytest.raises(IndexError):
        dataset[len(rows)]
    assert dataset.lengths.dtype == np.int64 and dataset.loss_tokens.dtype == np.int64
    assert dataset.lengths.tolist() == [len(r["input_ids"]) for r in rows]
    assert dataset.loss_tokens.tolist() == [
        sum(label != -100 for label in r["labels"][1:]) for r in rows
    ]
    assert dataset.line_numbers.tolist() == list(range(1, len(rows) + 1))


def test_built_in_memory_index_skips_dropped_lines(tmp_path, vocab):
    data = tmp_path / "data.jsonl"
    rows = [
        {"input_ids": [1, 2, 3], "labels": [-100, 2, 3]},
        {"input_ids": list(range(1, 30)), "labels": list(range(1, 30))},
        {"input_ids": [7, 8], "labels": [7, 8], "len": 2, "source": "x"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    index, summary = build_index(data, vocab, max_tokens=10, on_long="drop")
    dataset = IndexedJsonlDataset(data, index)
    assert summary["dropped"] == 1 and summary["dropped_lines"] == [2]
    assert [dataset[i] for i in range(len(dataset))] == [
        {"input_ids": [1, 2, 3], "labels": [-100, 2, 3]},
        {"input_ids": [7, 8], "labels": [7, 8]},
    ]
    assert dataset.line_numbers.tolist() == [1, 3]
    assert dataset.loss_tokens.tolist() == [2, 1]


def test_reads_from_disk_by_offset(indexed):
    """Nothing of the samples is cached: an in-place edit of equal length shows up."""
    data, index = indexed
    dataset = IndexedJsonlDataset.open(data, index)
    first_id = dataset[3]["input_ids"][0]
    assert 0 <= first_id <= 8, "the demo's first token is a one-digit special token id"
    raw = bytearray(data.read_bytes())
    digit = int(dataset._offsets[3]) + len(b'{"input_ids":[')
    assert raw[digit : digit + 2] == f"{first_id},".encode()
    raw[digit] = ord(str(first_id + 1))
    data.write_bytes(bytes(raw))
    assert dataset[3]["input_ids"][0] == first_id + 1


def _read_all(dataset: IndexedJsonlDataset) -> list[dict]:
    return [dataset[i] for i in range(len(dataset))]


def test_usable_after_fork_and_pickle(indexed):
    data, index = indexed
    dataset = IndexedJsonlDataset.open(data, index)
    expected = _read_all(dataset)  # opens the descriptor before forking
    with multiprocessing.get_context("fork").Pool(2) as pool:
        assert pool.map(_read_all, [dataset, dataset]) == [expected, expected]
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone._fd is None
    assert _read_all(clone) == expected


@pytest.mark.parametrize("change", ["append", "same_size_edit_at_end", "truncate"])
def test_stale_index_is_refused(indexed, change):
    data, index = indexed
    raw = data.read_bytes()
    if change == "append":
        data.write_bytes(raw + raw.splitlines(keepends=True)[0])
    elif change == "truncate":
        data.write_bytes(raw[: len(raw) // 2])
    else:
        assert raw.endswith(b"}\n") and raw[-3:-2].isdigit()
        digit = b"1" if raw[-3:-2] != b"1" else b"2"
        data.write_bytes(raw[:-3] + digit + raw[-2:])  # the last line's len, same size
    with pytest.raises(UserError, match="stale index"):
        IndexedJsonlDataset.open(data, index)


def test_stale_index_is_refused_by_the_cli_error_path(indexed):
    """The same check as the training engine's, through `IndexedJsonlDataset.open`'s message."""
    data, index = indexed
    data.write_bytes(data.read_bytes() + b"\n")
    with pytest.raises(UserError) as error:
        IndexedJsonlDataset.open(data, index)
    assert "rerun `mini-trainer validate`" in error.value.lines[0]
    assert str(index) in error.value.lines[0]


def test_copied_data_still_matches_its_index(indexed, tmp_path):
    data, index = indexed
    copy = tmp_path / "copy.jsonl"
    shutil.copy(data, copy)  # a new path and mtime, the same bytes
    dataset = IndexedJsonlDataset.open(copy, index)
    assert dataset[0]["input_ids"] == _rows(data)[0]["input_ids"]


def test_not_an_index_is_refused(indexed, tmp_path):
    data, _ = indexed
    import pandas as pd

    plain = tmp_path / "plain.parquet"
    pd.DataFrame({"line": [1]}).to_parquet(plain)
    with pytest.raises(UserError, match="not an index written by"):
        IndexedJsonlDataset.open(data, plain)
    with pytest.raises(UserError, match="cannot read the index"):
        IndexedJsonlDataset.open(data, data)


def test_index_that_does_not_match_its_line_is_detected(tmp_path, vocab):
    data = tmp_path / "data.jsonl"
    data.write_text('{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}\n')
    index, summary = build_index(data, vocab, max_tokens=10)
    write_index(index, summary, tmp_path / "i.parquet", tmp_path / "s.json")
    data.write_text('{"input_ids": [1, 2, 4], "labels": [-100, 2, 3]}\n')  # same size
    wrong = index.assign(len=[2])
    with pytest.raises(UserError, match="no longer matches its index"):
        IndexedJsonlDataset(data, wrong)[0]


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("input_ids", 999, "input_ids: token id 999 is outside the vocabulary (0..{top})"),
        ("input_ids", -7, "input_ids: token id -7 is outside the vocabulary (0..{top})"),
        ("labels", 999, "labels: 999 is neither -100 nor a token id of the vocabulary (0..{top})"),
        ("labels", -5, "labels: -5 is neither -100 nor a token id of the vocabulary (0..{top})"),
    ],
)
def test_a_token_id_edited_after_validation_is_caught_when_read(
    tmp_path, vocab, field, value, reason
):
    """A same-size edit in the middle of a large file passes the index's fingerprint (its first
    and last MiB; tests/test_launcher.py runs that end to end); the read itself must catch it."""
    data = tmp_path / "data.jsonl"
    data.write_text('{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}\n' * 3)
    index, summary = build_index(data, vocab, max_tokens=10)
    write_index(index, summary, tmp_path / "i.parquet", tmp_path / "s.json")
    edited = {"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}
    edited[field][2] = value
    line = json.dumps(edited, separators=(",", ":")).encode()
    raw = bytearray(data.read_bytes())
    start, nbytes = int(index["offset"][1]), int(index["nbytes"][1])
    raw[start : start + nbytes] = line.ljust(nbytes)
    data.write_bytes(bytes(raw))
    dataset = IndexedJsonlDataset(data, index, vocab)
    assert dataset[0]["input_ids"] == [1, 2, 3]
    with pytest.raises(UserError) as excinfo:
        dataset[1]
    assert excinfo.value.lines == [
        f"{data}:2: {reason.format(top=vocab - 1)} (the file changed after validation); "
        "rerun `mini-trainer validate`"
    ]
