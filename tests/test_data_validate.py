"""`mini-trainer validate`: every problem is reported at its exact line and field, nothing is
written on error, and a good file's index matches its lines."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from helpers import run_cli

from mini_trainer.data.validate import build_index, read_vocab_size
from mini_trainer.errors import UserError

MAX_TOKENS = 64


def _line(ids, labels=None, **extra) -> str:
    labels = [-100] + list(ids[1:]) if labels is None else labels
    return json.dumps({"input_ids": list(ids), "labels": labels, **extra})


GOOD = _line([5, 6, 7, 8])


@pytest.fixture(scope="module")
def vocab(demo_model) -> int:
    return read_vocab_size(demo_model)


def _bad_lines(vocab: int) -> dict[str, tuple[str, str, str]]:
    """case -> (the bad line, the FIELD it must be reported at, a word of the reason)."""
    return {
        "invalid_json": ('{"input_ids": [1, 2], "labels": [1, 2', "json", "invalid JSON"),
        "not_utf8": (b'{"input_ids": [1, 2], "labels": [-100, 2], "x": "\xff"}', "json", "UTF-8"),
        "not_an_object": ("[1, 2, 3]", "json", "expected a JSON object"),
        "blank_line": ("   ", "json", "blank line"),
        "missing_input_ids": ('{"labels": [-100, 2]}', "input_ids", "missing"),
        "missing_labels": ('{"input_ids": [1, 2]}', "labels", "missing"),
        "ids_not_a_list": ('{"input_ids": "1 2", "labels": [-100, 2]}', "input_ids", "string"),
        "ids_null": ('{"input_ids": null, "labels": [-100, 2]}', "input_ids", "null"),
        "float_id": (_line([1, 2.5, 3], [-100, 2, 3]), "input_ids[1]", "float 2.5"),
        "integral_float_id": (_line([1, 2.0, 3], [-100, 2, 3]), "input_ids[1]", "float 2.0"),
        "string_label": (_line([1, 2, 3], [-100, "2", 3]), "labels[1]", "string"),
        "bool_id": (_line([1, 2, True], [-100, 2, 3]), "input_ids[2]", "boolean true"),
        "bool_label": (_line([1, 2, 3], [-100, False, 3]), "labels[1]", "boolean false"),
        "nested_list": (_line([[1, 2], 3], [-100, 3]), "input_ids[0]", "a list"),
        "null_label": (_line([1, 2, 3], [-100, None, 3]), "labels[1]", "null"),
        "empty_sequences": (_line([], [-100, 5]), "input_ids", "empty sequence"),
        "length_mismatch": (_line([1, 2, 3], [-100, 2]), "labels", "has 2 entries"),
        "len_disagrees": (_line([1, 2, 3], len=4), "len", "is 4"),
        "len_not_int": (_line([1, 2, 3], len="3"), "len", "expected an integer"),
        "negative_id": (_line([1, -2, 3], [-100, 5, 3]), "input_ids[1]", "outside"),
        "id_at_vocab_size": (_line([1, 2, vocab], [-100, 2, 5]), "input_ids[2]", "outside"),
        "huge_id": (_line([1, 2**70], [-100, 5]), "input_ids[1]", "outside"),
        "label_minus_one": (_line([1, 2, 3], [-100, -1, 3]), "labels[1]", "neither -100"),
        "label_at_vocab_size": (_line([1, 2, 3], [-100, 2, vocab]), "labels[2]", "neither -100"),
        "no_loss_token": (_line([1, 2, 3], [-100, -100, -100]), "labels", "no loss token"),
        "loss_only_at_position_0": (_line([1, 2, 3], [1, -100, -100]), "labels", "no loss token"),
        "too_long": (_line(list(range(1, MAX_TOKENS + 2))), "input_ids", "--max-tokens-per-gpu"),
    }


CASES = list(_bad_lines(1000))


def _write(path, lines) -> None:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))


def _validate(data, model, tmp_path, *extra, max_tokens=MAX_TOKENS):
    index, summary = tmp_path / "index.parquet", tmp_path / "summary.json"
    result = run_cli(
        "validate", data, "--model", model, "--max-tokens-per-gpu", max_tokens,
        "--out-index", index, "--out-summary", summary, *extra,
    )  # fmt: skip
    return result, index, summary


@pytest.mark.parametrize("case", CASES)
def test_each_problem_is_reported_at_its_line_and_field(case, demo_model, vocab, tmp_path):
    bad, field, reason = _bad_lines(vocab)[case]
    data = tmp_path / "data.jsonl"
    _write(data, [GOOD, bad, GOOD])
    result, index, summary = _validate(data, demo_model, tmp_path)
    assert result.returncode == 2, result.stderr
    errors = result.stderr.splitlines()
    assert errors[0].startswith(f"error: {data}:2: {field}: "), errors
    assert reason in errors[0]
    hint = (
        [
            "error: samples longer than --max-tokens-per-gpu: 1; pass --on-long drop to leave "
            "them out of the index (they are counted in the summary)"
        ]
        if case == "too_long"
        else []
    )
    assert errors[1:] == [f"error: {data}: 1 problem; no index written", *hint]  # fmt: skip
    assert not index.exists() and not summary.exists()
    assert list(tmp_path.iterdir()) == [data], "a temporary file was left behind"


def test_empty_file(demo_model, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_bytes(b"")
    result, index, summary = _validate(data, demo_model, tmp_path)
    assert result.returncode == 2
    assert f"error: {data}: empty file" in result.stderr
    assert not index.exists() and not summary.exists()


def test_all_problems_counted_but_list_capped(demo_model, tmp_path):
    data = tmp_path / "data.jsonl"
    _write(data, [GOOD] + ["{oops"] * 120 + [_line([1, 2, 3], [-100, -1, 3])])
    result, index, _ = _validate(data, demo_model, tmp_path)
    assert result.returncode == 2
    errors = result.stderr.splitlines()
    assert len(errors) == 51
    assert errors[0].startswith(f"error: {data}:2: json: ")
    assert errors[49].startswith(f"error: {data}:51: json: ")
    assert errors[-1] == f"error: {data}: 121 problems (first 50 shown); no index written"
    assert not index.exists()


def test_several_problems_on_one_line(vocab, tmp_path):
    data = tmp_path / "data.jsonl"
    _write(data, [_line([1, vocab + 1, 3], [-100, 2, -7], len=9)])
    with pytest.raises(UserError) as error:
        build_index(data, vocab, MAX_TOKENS)
    fields = [line.split(": ")[1] for line in error.value.lines[:-1]]
    assert fields == ["len", "input_ids[1]", "labels[2]"]


def test_missing_model_config(tmp_path):
    data = tmp_path / "data.jsonl"
    _write(data, [GOOD])
    (tmp_path / "model").mkdir()
    result, index, _ = _validate(data, tmp_path / "model", tmp_path)
    assert result.returncode == 2
    assert "no config.json" in result.stderr
    assert not index.exists()


def _demo_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_good_file_index_matches_its_lines(demo_dir, demo_model, vocab, tmp_path):
    data = demo_dir / "data" / "sort_desc.eval.jsonl"
    result, index_path, summary_path = _validate(data, demo_model, tmp_path, max_tokens=512)
    assert result.returncode == 0, result.stderr
    assert "200 samples" in result.stdout
    index = pd.read_parquet(index_path)
    assert list(index.columns) == ["line", "offset", "nbytes", "len", "loss_tokens"]
    assert all(index[c].dtype == np.int64 for c in index.columns)
    raw = data.read_bytes()
    rows = _demo_lines(data)
    assert index["line"].tolist() == list(range(1, len(rows) + 1))
    for record, row in zip(index.itertuples(), rows, strict=True):
        line = raw[record.offset : record.offset + record.nbytes]
        assert json.loads(line) == row
        assert raw[record.offset + record.nbytes : record.offset + record.nbytes + 1] == b"\n"
        assert record.len == len(row["input_ids"])
        assert record.loss_tokens == sum(label != -100 for label in row["labels"][1:])
    summary = json.loads(summary_path.read_text())
    assert summary["samples"] == len(rows) and summary["dropped"] == 0
    assert summary["tokens"] == index["len"].sum()
    assert summary["loss_tokens"] == index["loss_tokens"].sum()
    assert summary["vocab_size"] == vocab
    assert summary["length"]["max"] == index["len"].max()
    assert summary["length"]["p50"] == int(np.percentile(index["len"], 50, method="higher"))
    assert summary["data_file"] == str(data)


def test_on_long_drop_counts_and_excludes(demo_dir, demo_model, tmp_path):
    data = demo_dir / "data" / "sort.eval.jsonl"
    rows = _demo_lines(data)
    cap = int(np.percentile([len(r["input_ids"]) for r in rows], 80))
    long_lines = [n for n, r in enumerate(rows, start=1) if len(r["input_ids"]) > cap]
    assert 0 < len(long_lines) < len(rows)
    index_path, summary_path = tmp_path / "i.parquet", tmp_path / "s.json"
    args = ["validate", data, "--model", demo_model, "--max-tokens-per-gpu", cap]
    args += ["--out-index", index_path, "--out-summary", summary_path]
    refused = run_cli(*args)
    assert refused.returncode == 2
    assert f"error: {data}:{long_lines[0]}: input_ids: " in refused.stderr
    assert not index_path.exists()
    result = run_cli(*args, "--on-long", "drop", check=True)
    assert f"{len(long_lines)} dropped" in result.stdout
    index = pd.read_parquet(index_path)
    summary = json.loads(summary_path.read_text())
    assert summary["dropped"] == len(long_lines)
    assert summary["samples"] == len(rows) - len(long_lines) == len(index)
    assert set(index["line"]).isdisjoint(long_lines)
    assert index["len"].max() <= cap


def test_all_dropped_is_an_error(vocab, tmp_path):
    data = tmp_path / "data.jsonl"
    _write(data, [_line(list(range(1, 20)))] * 3)
    with pytest.raises(UserError, match="no sample left: all 3"):
        build_index(data, vocab, 10, on_long="drop")


def test_no_trailing_newline_and_index_metadata(vocab, tmp_path):
    from mini_trainer.data.validate import write_index

    data = tmp_path / "data.jsonl"
    data.write_text(GOOD + "\n" + _line([9, 8, 7]))
    index, summary = build_index(data, vocab, MAX_TOKENS, progress=False)
    assert index["nbytes"].tolist() == [len(GOOD), len(_line([9, 8, 7]))]
    write_index(index, summary, tmp_path / "i.parquet", tmp_path / "s.json")
    metadata = json.loads(pq.read_schema(tmp_path / "i.parquet").metadata[b"mini_trainer.index"])
    assert metadata["data"]["size"] == data.stat().st_size
    assert metadata["data"]["path"] == str(data.resolve())


def test_refuses_to_overwrite_without_force(demo_dir, demo_model, tmp_path):
    data = demo_dir / "data" / "sort.eval.jsonl"
    summary = tmp_path / "summary.json"
    summary.write_text("mine")
    result, index, _ = _validate(data, demo_model, tmp_path)
    assert result.returncode == 2
    assert "already exists" in result.stderr
    assert summary.read_text() == "mine" and not index.exists()
    result, index, _ = _validate(data, demo_model, tmp_path, "--force", max_tokens=512)
    assert result.returncode == 0, result.stderr
    assert json.loads(summary.read_text())["samples"] == 200


def test_refuses_to_overwrite_the_data(demo_model, tmp_path):
    data = tmp_path / "data.jsonl"
    _write(data, [GOOD])
    result = run_cli(
        "validate", data, "--model", demo_model, "--max-tokens-per-gpu", 8,
        "--out-index", data, "--out-summary", tmp_path / "s.json", "--force",
    )  # fmt: skip
    assert result.returncode == 2
    assert "would overwrite an input" in result.stderr
    assert data.read_text() == GOOD + "\n"


def test_the_token_cap_is_required(demo_model, tmp_path):
    """Not a TypeError mid-scan: click asks for the option (it did not under click 8.5 while
    the option was declared with an explicit `default=None`)."""
    data = tmp_path / "data.jsonl"
    _write(data, [GOOD])
    result = run_cli(
        "validate", data, "--model", demo_model,
        "--out-index", tmp_path / "i.parquet", "--out-summary", tmp_path / "s.json",
    )  # fmt: skip
    assert result.returncode == 2
    assert "Missing option '--max-tokens-per-gpu'" in result.stderr, result.stderr
    assert not (tmp_path / "i.parquet").exists() and not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("chunk_bytes", [1, 7, 100, 10**9])
def test_split_ranges_cut_at_line_starts(tmp_path, chunk_bytes):
    from mini_trainer.data.scan import split_ranges

    data = tmp_path / "data.jsonl"
    data.write_bytes(b"".join(b"x" * (n % 13) + b"\n" for n in range(40)) + b"no newline")
    raw = data.read_bytes()
    bounds = split_ranges(data, len(raw), chunk_bytes)
    assert bounds[0] == 0 and bounds[-1] == len(raw)
    assert bounds == sorted(set(bounds))
    assert all(raw[b - 1 : b] == b"\n" for b in bounds[1:-1])
    if chunk_bytes == 1:
        assert len(bounds) - 1 == 41  # every line is its own range


def test_parallel_ranges_match_a_single_pass(demo_dir, vocab, tmp_path):
    from mini_trainer.data.scan import scan_file

    lines = (demo_dir / "data" / "sort_desc.train.jsonl").read_text().splitlines()
    bad = {7: "{oops", 600: _line([1, vocab], [-100, 5]), 1999: "[]"}
    for number, line in bad.items():
        lines[number - 1] = line
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(lines) + "\n")
    one = scan_file(data, vocab, 100, "drop", workers=1, chunk_bytes=10**9)
    many = scan_file(data, vocab, 100, "drop", workers=2, chunk_bytes=20_000)
    assert [n for n, _, _ in one.problems] == sorted(bad)
    assert one.problems == many.problems and one.problem_count == many.problem_count == 3
    assert np.array_equal(one.rows, many.rows)
    assert one.dropped == many.dropped > 0 and one.dropped_lines == many.dropped_lines
    assert one.lines == many.lines == len(lines)
    assert one.end == many.end == data.stat().st_size


def test_same_json_fault_reads_the_same_in_validate_and_tokenize():
    from mini_trainer.data.checks import check_line
    from mini_trainer.data.tokenize import _messages_of

    for raw in (b'{"messages": [', b"", b"\xff", b'{"a": 1,}'):
        (validate_problem,) = check_line(raw, 100).problems
        _, tokenize_problem = _messages_of(raw)
        assert validate_problem == tokenize_problem, raw


def test_chat_data_points_at_tokenize():
    from mini_trainer.data.checks import check_line

    (problem,) = check_line(b'{"messages": [{"role": "user", "content": "hi"}]}', 100).problems
    assert problem[0] == "input_ids" and "mini-trainer tokenize" in problem[1]


def test_samples_over_the_cap_are_counted_and_the_hint_comes_once(tmp_path):
    import json

    import pytest

    from mini_trainer.data.validate import build_index
    from mini_trainer.errors import UserError

    data = tmp_path / "d.jsonl"
    rows = [{"input_ids": list(range(n)), "labels": list(range(n))} for n in (3, 9, 9, 4)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(UserError) as error:
        build_index(data, 100, 5, long_hint="{count} too long: do X")
    lines = error.value.lines
    assert lines[-1] == "2 too long: do X"
    assert sum("do X" in line or "--on-long" in line for line in lines) == 1
    assert lines[0] == f"{data}:2: input_ids: 9 tokens, more than --max-tokens-per-gpu 5"
