"""`mini-trainer mix`: a weighted mixture of JSONL datasets, with replay, as one new file.

The mixture is written out as an ordinary data file (then validated and trained on like any
other), so the training engine does not know about mixtures: its exact token-mean loss, its
bit-identical resume and its every-sample-once-per-epoch plan hold for the mixed file unchanged.

Definitions (docs/data.md says the same for users):

- Weighted inputs (`--input FILE WEIGHT`): the weights are the inputs' shares of the weighted
  part of the output, `share_i = weight_i / sum(weights)`. The first weighted input is the
  anchor: each of its N_1 samples appears exactly once. Input i contributes
  `round(weight_i / weight_1 * N_1)` samples, drawn without replacement; asking for more than the
  file has is an error unless `oversample` is set, and then every sample appears
  `count // N_i` times and a random `count % N_i` of them once more.
- Replay inputs (`--replay FILE FRACTION`): `round(fraction * N_i)` of that file's own samples,
  drawn without replacement (fraction in [0, 1]); they come on top of the weighted part.
- Selection is deterministic for a seed: input i's samples are the first `count` of the
  permutation `default_rng([seed, i]).permutation(N_i)`, so a larger count keeps every sample a
  smaller count chose. The output order is one seeded permutation of all chosen samples.

Lines are copied byte for byte and not parsed (validate checks them afterwards). A sidecar JSON
records which (input, line) each output line is; validate reads it back (`line_sources`) to name
the source line of each problem it finds in a mixture.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mini_trainer.data.lines import iter_lines
from mini_trainer.data.problems import ProblemLog
from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_path

WEIGHT = "weight"
REPLAY = "replay"
SIDECAR_SUFFIX = ".mix.json"
"""A mixture NAME.jsonl's sidecar is NAME.mix.json beside it (the pipeline's layout, and the
one docs/data.md shows), which is where `line_sources` looks for it."""


@dataclass(frozen=True)
class MixInput:
    """One input of a mixture: a file and either its weight or its replay fraction."""

    path: Path
    kind: str
    """`WEIGHT` (a share of the weighted part) or `REPLAY` (a fraction of the file's samples)."""
    value: float


def check_inputs(inputs: list[MixInput]) -> None:
    """Refuse a mixture that is not well defined, with one line naming the input."""
    weighted = [i for i in inputs if i.kind == WEIGHT]
    if not weighted:
        raise UserError("mix: at least one --input FILE WEIGHT is needed (its samples anchor)")
    for item in inputs:
        if item.kind not in (WEIGHT, REPLAY):
            raise ValueError(f"unknown mix input kind {item.kind!r}")
        if not math.isfinite(item.value):
            raise UserError(f"{item.path}: {item.kind} {item.value} is not a finite number")
        if item.kind == WEIGHT and item.value < 0:
            raise UserError(f"{item.path}: weight {item.value} is negative")
        if item.kind == REPLAY and not 0.0 <= item.value <= 1.0:
            raise UserError(f"{item.path}: replay fraction {item.value} is outside [0, 1]")
    if sum(i.value for i in weighted) <= 0:
        raise UserError("mix: the weights sum to zero (no sample would be chosen)")
    if weighted[0].value <= 0:
        raise UserError(
            f"{weighted[0].path}: weight {weighted[0].value}: the first input anchors the "
            "mixture (all its samples appear once) and needs a positive weight"
        )


def _round(x: float) -> int:
    """Half up, so 2.5 -> 3 (Python's round would give 2)."""
    return int(math.floor(x + 0.5))


def sample_counts(inputs: list[MixInput], sizes: list[int], oversample: bool) -> list[int]:
    """How many samples each input contributes (see the module docstring)."""
    check_inputs(inputs)
    anchor = next(i for i, item in enumerate(inputs) if item.kind == WEIGHT)
    counts = []
    for item, size in zip(inputs, sizes, strict=True):
        if item.kind == REPLAY:
            count = _round(item.value * size)
        else:
            count = _round(item.value / inputs[anchor].value * sizes[anchor])
            if count > size and not oversample:
                raise UserError(
                    f"{item.path}: weight {item.value} needs {count:,} samples but the file has "
                    f"{size:,} (lower the weight, or oversample to repeat samples)"
                )
        counts.append(count)
    return counts


def choose(size: int, count: int, seed: int, position: int) -> np.ndarray:
    """`count` 0-based sample indices of a `size`-sample input, deterministic for the seed.

    Without replacement while `count <= size`; above, whole passes plus a random remainder.
    """
    order = np.random.default_rng([seed, position]).permutation(size)
    passes, rest = divmod(count, size) if size else (0, 0)
    return np.concatenate([np.tile(order, passes), order[:rest]]).astype(np.int64)


def plan_mix(
    inputs: list[MixInput], sizes: list[int], seed: int, oversample: bool = False
) -> np.ndarray:
    """The mixture as an (n, 2) int64 array of (input position, 0-based sample index) rows,
    in output order. Pure: depends only on its arguments."""
    counts = sample_counts(inputs, sizes, oversample)
    parts = [
        np.column_stack([np.full(count, i, dtype=np.int64), choose(size, count, seed, i)])
        for i, (size, count) in enumerate(zip(sizes, counts, strict=True))
    ]
    rows = np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)
    order = np.random.default_rng([seed, len(inputs)]).permutation(len(rows))
    return rows[order]


def line_spans(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Byte offset and length of every line of a JSONL file; `UserError` on a blank line."""
    log = ProblemLog(str(path))
    offsets, lengths = [], []
    for number, offset, raw in iter_lines(path):
        if not raw.strip():
            log.add(number, "json", "blank line")
            continue
        offsets.append(offset)
        lengths.append(len(raw))
    if not offsets and not log.count:
        log.add_file_problem("empty file (no samples)")
    log.raise_if_any("no mixture written")
    return np.asarray(offsets, dtype=np.int64), np.asarray(lengths, dtype=np.int64)


def write_mix(
    inputs: list[MixInput],
    out: str | os.PathLike,
    sidecar: str | os.PathLike,
    seed: int,
    oversample: bool = False,
) -> dict:
    """Write the mixture to `out` and its sidecar JSON, both atomically; return the sidecar."""
    check_inputs(inputs)
    for item in inputs:
        if not Path(item.path).is_file():
            raise UserError(f"{item.path}: no such file")
    spans = [line_spans(item.path) for item in inputs]
    sizes = [len(offsets) for offsets, _ in spans]
    rows = plan_mix(inputs, sizes, seed, oversample)
    # Lines (1-based) as the sidecar names them: blank lines are refused, so sample k of a
    # file is line k + 1 of it.
    with atomic_path(out) as tmp, open(tmp, "wb") as handle, contextlib.ExitStack() as stack:
        files = [stack.enter_context(open(item.path, "rb")) for item in inputs]
        for position, sample in rows:
            offsets, lengths = spans[position]
            data = os.pread(files[position].fileno(), int(lengths[sample]), int(offsets[sample]))
            handle.write(data + b"\n")
    counts = np.bincount(rows[:, 0], minlength=len(inputs)) if len(rows) else [0] * len(inputs)
    record = {
        "seed": seed,
        "oversample": oversample,
        "samples": len(rows),
        "inputs": [
            {
                "path": str(item.path),
                item.kind if item.kind == WEIGHT else "fraction": item.value,
                "kind": item.kind,
                "samples_in_file": size,
                "chosen": int(count),
            }
            for item, size, count in zip(inputs, sizes, counts, strict=True)
        ],
        "lines": [[int(p), int(s) + 1] for p, s in rows],
    }
    with atomic_path(sidecar) as tmp:
        tmp.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    return record


def sidecar_beside(data_path: str | os.PathLike) -> Path:
    """NAME.mix.json for NAME.jsonl (NAME.EXT.mix.json for another extension)."""
    path = Path(data_path)
    return path.with_name(path.name.removesuffix(".jsonl") + SIDECAR_SUFFIX)


def line_sources(data_path: str | os.PathLike, lines: int) -> Callable[[int], str] | None:
    """`line -> "SOURCE:LINE"` for a mixture of `lines` lines whose sidecar sits beside it.

    For error messages only: a problem in a mixture is a problem in one of its inputs, which is
    the file to fix. None when there is no sidecar, it cannot be read, or it describes a file
    of another length (a stale sidecar, or a file that only looks like a mixture)."""
    try:
        record = json.loads(sidecar_beside(data_path).read_text())
        paths = [item["path"] for item in record["inputs"]]
        origin = record["lines"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(origin, list) or len(origin) != lines:
        return None

    def source(line: int) -> str:
        try:
            position, source_line = origin[line - 1]
            return f"{paths[position]}:{source_line}"
        except (IndexError, TypeError, ValueError):
            return "an unknown line (the sidecar does not say)"

    return source
