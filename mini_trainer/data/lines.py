"""Streaming a JSONL file line by line with byte offsets, in constant memory.

`tokenize` reads its input this way (`validate` reads byte ranges in parallel, see `scan`): one
line in memory at a time, its 1-based number and byte offset known, and a progress bar by bytes
that only appears when stderr is a terminal.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

PROGRESS_EVERY_BYTES = 4 << 20


def progress_enabled(progress: bool | None) -> bool:
    """`None` means: show a bar only when a person is watching (stderr is a terminal)."""
    if progress is None:
        return sys.stderr.isatty()
    return progress


def iter_lines(
    path: str | os.PathLike, progress: bool | None = None
) -> Iterator[tuple[int, int, bytes]]:
    """Yield `(line_number, byte_offset, line)` for every line, without its `\\n` terminator.

    A final line without a newline is yielded too; an empty file yields nothing.
    """
    path = Path(path)
    bar = None
    if progress_enabled(progress):
        bar = tqdm(
            total=path.stat().st_size,
            unit="B",
            unit_scale=True,
            desc=path.name,
            file=sys.stderr,
            mininterval=0.5,
        )
    offset = 0
    pending = 0
    try:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                size = len(raw)
                yield number, offset, raw[:-1] if raw.endswith(b"\n") else raw
                offset += size
                if bar is not None:
                    pending += size
                    if pending >= PROGRESS_EVERY_BYTES:
                        bar.update(pending)
                        pending = 0
    finally:
        if bar is not None:
            bar.update(pending)
            bar.close()


def count_lines(path: str | os.PathLike, chunk_bytes: int = 16 * 1024**2) -> int:
    """Lines of `path` as `iter_lines` numbers them (a final line without `\n` counts)."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")
