"""Checking one pre-tokenized JSONL line: pure functions, no I/O.

A line is `{"input_ids": [...], "labels": [...], "len": N}` (`len` optional, other keys
ignored). The common case, a good line, takes a fast path: C-level `sum`/`min`/`max` and one
numpy pass per list. Only when that finds something wrong does a plain Python loop locate the
first offending element, so messages point at an exact `FIELD[i]`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import orjson

from mini_trainer.labels import IGNORE_INDEX

SEQUENCE_FIELDS = ("input_ids", "labels")


@dataclass(frozen=True)
class LineCheck:
    """The outcome of checking one line."""

    length: int = 0
    """Tokens in the sample (0 when the line has problems)."""
    loss_tokens: int = 0
    """Positions t >= 1 whose label is not -100 (position 0 is never a target)."""
    problems: tuple[tuple[str, str], ...] = ()
    """`(FIELD, reason)` pairs; empty for a good line."""


def describe(value: object) -> str:
    """A JSON-flavoured description of a wrong value, short enough for one error line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean " + ("true" if value else "false")
    if isinstance(value, float):
        return f"float {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 20 else value[:17] + "..."
        return f"string {shown!r}"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _first_non_int(values: list) -> int | None:
    for i, value in enumerate(values):
        if type(value) is not int:
            return i
    return None


def _all_ints(values: list, may_have_bools: bool) -> bool:
    """Fast test that every element is a JSON integer (bool is an int subclass: handled)."""
    try:
        if type(sum(values)) is not int:  # a float anywhere makes the sum a float
            return False
    except TypeError:  # a string, null, list or object
        return False
    return not may_have_bools or _first_non_int(values) is None


def _check_type(name: str, value: object, may_have_bools: bool) -> tuple[str, str] | None:
    if not isinstance(value, list):
        return name, f"expected a list of integers, got {describe(value)}"
    if not value:
        return name, "empty sequence"
    if not _all_ints(value, may_have_bools):
        i = _first_non_int(value)
        return f"{name}[{i}]", f"expected an integer, got {describe(value[i])}"
    return None


def _as_array(values: list[int]) -> np.ndarray | None:
    """int64 array of `values`, or None when one does not fit in 64 bits (out of range anyway)."""
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except OverflowError:
        return None


def _check_ids(ids: list[int], vocab_size: int) -> tuple[str, str] | None:
    array = _as_array(ids)
    if array is not None and array.min() >= 0 and array.max() < vocab_size:
        return None
    i = next(i for i, t in enumerate(ids) if not 0 <= t < vocab_size)
    return (
        f"input_ids[{i}]",
        f"token id {ids[i]} is outside the model's vocabulary (0..{vocab_size - 1})",
    )


def _check_labels(labels: list[int], vocab_size: int) -> tuple[tuple[str, str] | None, int]:
    """Return (problem, loss tokens after the causal shift)."""
    array = _as_array(labels)
    if array is not None:
        targets = array != IGNORE_INDEX
        kept = array[targets]
        if kept.size == 0 or (kept.min() >= 0 and kept.max() < vocab_size):
            return None, int(np.count_nonzero(targets[1:]))
    i = next(i for i, t in enumerate(labels) if t != IGNORE_INDEX and not 0 <= t < vocab_size)
    reason = f"{labels[i]} is neither -100 nor a token id of the vocabulary (0..{vocab_size - 1})"
    return (f"labels[{i}]", reason), 0


def parse_json_line(raw: bytes) -> tuple[object, tuple[str, str] | None]:
    """Parse with the stdlib: its acceptance and messages are the reference.

    validate and tokenize both report a line that is not JSON through this function, so the
    same fault reads the same in both.
    """
    if not raw.strip():
        return None, ("json", "blank line (JSONL needs one JSON object per line)")
    try:
        return json.loads(raw), None
    except UnicodeDecodeError as error:
        return None, ("json", f"not valid UTF-8 (byte {error.start})")
    except json.JSONDecodeError as error:
        return None, ("json", f"invalid JSON: {error.msg} at column {error.colno}")
    except ValueError as error:  # e.g. an integer literal too long for Python to parse
        return None, ("json", f"invalid JSON: {error}")


def check_line(raw: bytes, vocab_size: int) -> LineCheck:
    """Check one line (without its newline) against a model vocabulary of `vocab_size` ids.

    orjson parses about 1.7x faster than the stdlib, but reads integers beyond 64 bits as
    floats and refuses some things the stdlib takes. So it is only trusted to accept: a line
    it cannot parse, or whose parse has a problem, is parsed again with the stdlib and checked
    from that, and every message is the stdlib-based one. A line that passes with orjson has
    only exact 64-bit integers in the checked fields, which both parsers read identically.
    """
    try:
        result = check_sample(orjson.loads(raw), raw, vocab_size)
        if not result.problems:
            return result
    except orjson.JSONDecodeError:
        pass
    sample, problem = parse_json_line(raw)
    if problem:
        return LineCheck(problems=(problem,))
    return check_sample(sample, raw, vocab_size)


def check_sample(sample: object, raw: bytes, vocab_size: int) -> LineCheck:
    """Check one parsed line; `raw` is its text (scanned once for `true`/`false`)."""
    if not isinstance(sample, dict):
        return LineCheck(problems=(("json", f"expected a JSON object, got {describe(sample)}"),))
    may_have_bools = b"true" in raw or b"false" in raw
    problems = []
    if "messages" in sample and not any(name in sample for name in SEQUENCE_FIELDS):
        return LineCheck(problems=((
            "input_ids",
            "missing: this line is chat data (messages); pre-tokenize the file first with "
            "mini-trainer tokenize FILE --model MODEL --out TOKENIZED.jsonl",
        ),))  # fmt: skip
    for name in SEQUENCE_FIELDS:
        if name not in sample:
            problems.append((name, "missing"))
        elif problem := _check_type(name, sample[name], may_have_bools):
            problems.append(problem)
    if problems:
        return LineCheck(problems=tuple(problems))
    ids, labels = sample["input_ids"], sample["labels"]
    if len(labels) != len(ids):
        problems.append(
            ("labels", f"has {len(labels)} entries but input_ids has {len(ids)} (must be equal)")
        )
    if "len" in sample:
        given = sample["len"]
        if type(given) is not int:
            problems.append(("len", f"expected an integer, got {describe(given)}"))
        elif given != len(ids):
            problems.append(("len", f"is {given} but input_ids has {len(ids)} tokens"))
    if problem := _check_ids(ids, vocab_size):
        problems.append(problem)
    label_problem, loss_tokens = _check_labels(labels, vocab_size)
    if label_problem:
        problems.append(label_problem)
    elif loss_tokens == 0 and len(labels) == len(ids):
        problems.append(
            ("labels", "no loss token: every label after position 0 is -100 (nothing to train on)")
        )
    if problems:
        return LineCheck(problems=tuple(problems))
    return LineCheck(length=len(ids), loss_tokens=loss_tokens)
