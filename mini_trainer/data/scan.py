"""Scanning a pre-tokenized JSONL file in byte ranges, in parallel, in constant memory.

`json.loads` of a 500-token line is most of the cost of validation, so the file is cut into
ranges of about `CHUNK_BYTES` at line starts and the ranges are checked by a pool of worker
processes (or in this process for small files). Each range reports its rows with line numbers
relative to the range; `scan_file` renumbers them in file order. Memory per process is one line
plus its part of the index.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from mini_trainer.data.checks import check_line
from mini_trainer.data.lines import progress_enabled
from mini_trainer.data.problems import MAX_SHOWN

CHUNK_BYTES = 32 << 20
"""Bytes per range: large enough to amortise a task, small enough for a smooth progress bar."""
MAX_WORKERS = 8


@dataclass(frozen=True)
class ScanTask:
    """One byte range of the file to check; picklable, for worker processes."""

    path: str
    start: int
    end: int
    vocab_size: int
    max_tokens: int
    on_long: str


@dataclass
class RangeResult:
    """What one range holds; line numbers are 1-based within the range."""

    lines: int = 0
    """Lines in the range."""
    rows: np.ndarray = field(default_factory=lambda: np.empty((0, 5), dtype=np.int64))
    """Kept samples: (line, offset, nbytes, len, loss_tokens)."""
    problems: list[tuple[int, str, str]] = field(default_factory=list)
    """The first `MAX_SHOWN` problems as (line, FIELD, reason)."""
    problem_count: int = 0
    too_long: int = 0
    dropped: int = 0
    dropped_lines: list[int] = field(default_factory=list)
    end: int = 0
    """Byte offset just past the last line read."""


def default_workers() -> int:
    """CPUs this process may use, at most `MAX_WORKERS`."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    return max(1, min(available, MAX_WORKERS))


def split_ranges(path: str | os.PathLike, size: int, chunk_bytes: int = CHUNK_BYTES) -> list[int]:
    """Boundaries [0, b1, ..., size] of ranges of about `chunk_bytes`, each at a line start."""
    count = max(1, math.ceil(size / chunk_bytes))
    bounds = [0]
    with open(path, "rb") as handle:
        for k in range(1, count):
            handle.seek(max(bounds[-1], k * size // count - 1))
            handle.readline()  # to the start of the next line at or after the target
            position = min(handle.tell(), size)
            if position > bounds[-1]:
                bounds.append(position)
    if bounds[-1] != size:
        bounds.append(size)
    return bounds


LONG_FLAG = "--max-tokens-per-gpu"
"""The cap a long sample's reason names; `build_index` names its caller's flag instead."""


def _long_reason(length: int, max_tokens: int) -> str:
    # The remedy is the caller's to say, once (it differs for validate and train).
    return f"{length} tokens, more than {LONG_FLAG} {max_tokens}"


def scan_range(task: ScanTask) -> RangeResult:
    """Check every line that starts in [task.start, task.end)."""
    result = RangeResult(end=task.start)
    rows: list[tuple[int, int, int, int, int]] = []
    offset, number = task.start, 0
    with open(task.path, "rb") as handle:
        handle.seek(task.start)
        for raw in handle:
            if offset >= task.end:
                break
            number += 1
            line = raw[:-1] if raw.endswith(b"\n") else raw
            check = check_line(line, task.vocab_size)
            problems = list(check.problems)
            if not problems and check.length > task.max_tokens:
                if task.on_long == "error":
                    problems.append(("input_ids", _long_reason(check.length, task.max_tokens)))
                    result.too_long += 1
                else:
                    result.dropped += 1
                    if len(result.dropped_lines) < MAX_SHOWN:
                        result.dropped_lines.append(number)
            elif not problems:
                rows.append((number, offset, len(line), check.length, check.loss_tokens))
            for field_name, reason in problems:
                result.problem_count += 1
                if len(result.problems) < MAX_SHOWN:
                    result.problems.append((number, field_name, reason))
            offset += len(raw)
    result.lines, result.end = number, offset
    if rows:
        result.rows = np.array(rows, dtype=np.int64)
    return result


@dataclass
class ScanResult:
    """The whole file, in file order, with absolute line numbers."""

    lines: int
    rows: np.ndarray
    problems: list[tuple[int, str, str]]
    problem_count: int
    dropped: int
    dropped_lines: list[int]
    end: int
    too_long: int = 0
    """Samples over the cap (with on_long "error"): counted, so callers need not read messages."""


def _merge(results: list[RangeResult]) -> ScanResult:
    merged = ScanResult(0, np.empty((0, 5), dtype=np.int64), [], 0, 0, [], 0)
    parts = []
    for part in results:
        first_line = merged.lines
        rows = part.rows.copy()
        rows[:, 0] += first_line
        parts.append(rows)
        room = MAX_SHOWN - len(merged.problems)
        merged.problems += [(n + first_line, f, r) for n, f, r in part.problems[:room]]
        merged.problem_count += part.problem_count
        room = MAX_SHOWN - len(merged.dropped_lines)
        merged.dropped_lines += [n + first_line for n in part.dropped_lines[:room]]
        merged.dropped += part.dropped
        merged.too_long += part.too_long
        merged.lines += part.lines
        merged.end = part.end
    merged.rows = np.concatenate(parts) if parts else merged.rows
    return merged


def scan_file(
    path: str | os.PathLike,
    vocab_size: int,
    max_tokens: int,
    on_long: str,
    workers: int | None = None,
    progress: bool | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> ScanResult:
    """Check every line of `path`, with `workers` processes (default: the usable CPUs)."""
    size = Path(path).stat().st_size
    bounds = split_ranges(path, size, chunk_bytes)
    tasks = [
        ScanTask(str(path), start, end, vocab_size, max_tokens, on_long)
        for start, end in zip(bounds, bounds[1:], strict=False)
    ]
    workers = min(workers or default_workers(), len(tasks))
    bar = None
    if progress_enabled(progress):
        bar = tqdm(total=size, unit="B", unit_scale=True, desc=Path(path).name, file=sys.stderr)
    results = []
    try:
        if workers <= 1:
            outputs = map(scan_range, tasks)
            pool = None
        else:
            # spawn, not fork: the caller (a training process) may hold threads and CUDA state.
            pool = multiprocessing.get_context("spawn").Pool(workers)
            outputs = pool.imap(scan_range, tasks)
        for task, output in zip(tasks, outputs, strict=True):
            results.append(output)
            if bar is not None:
                bar.update(task.end - task.start)
        if pool is not None:
            pool.close()
            pool.join()
            pool = None
    finally:
        if pool is not None:
            pool.terminate()
        if bar is not None:
            bar.close()
    return _merge(results)
