"""The sizes of a pipeline's data files for `plan --config`: a file on disk as it is, one the
DAG has yet to write estimated from the files it copies lines from (unlike `layout`, this reads
the file system).

- a file that exists: its bytes and lines;
- a mixture (`mix` rule, docs/data.md): per input, the samples the mix command takes of it
  (`data/mix.sample_counts`) at that input's mean line size;
- a task's validation split (`split_validation`): `ceil(fraction x lines)` of its training
  file's lines, and the rest as its training part, at the file's mean line size (exact unless
  lines are excluded as duplicates of an eval file);
- a tokenized chat file not yet written: not known (its size depends on the tokenizer).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from mini_trainer.data.mix import MixInput, sample_counts
from mini_trainer.pipeline import data
from mini_trainer.pipeline.layout import Config, mix_inputs, task_file

BLOCK = 1 << 24
"""Bytes read at a time when counting lines."""


@dataclass(frozen=True)
class Size:
    """A data file's size, measured or estimated."""

    bytes: int
    lines: int

    def __post_init__(self):
        if self.bytes < 0 or self.lines < 0:
            raise ValueError(f"Size: negative ({self.bytes} bytes, {self.lines} lines)")

    def take(self, lines: int) -> Size:
        """`lines` of this file's lines, at its mean line size."""
        return Size(round(self.bytes * lines / self.lines) if self.lines else 0, lines)


def measured(path: str) -> Size | None:
    """The bytes and lines (a last line without a newline counts) of `path`, or None."""
    if not os.path.isfile(path):
        return None
    lines, last = 0, b"\n"
    with open(path, "rb") as handle:
        while block := handle.read(BLOCK):
            lines += block.count(b"\n")
            last = block[-1:]
    return Size(os.path.getsize(path), lines + (last != b"\n"))


def size_of(config: Config, path: str) -> Size | None:
    """`path`'s size: measured when it exists, else estimated (module docstring), else None."""
    found = measured(path)
    if found is not None:
        return found
    if path.startswith(f"results/data/{data.MIX_PREFIX}") and path.endswith(".jsonl"):
        return _mixture(config, path.removeprefix("results/data/").removesuffix(".jsonl"))
    for part in ("train", "validation"):
        suffix = f".split.{part}.jsonl"
        if path.startswith("results/data/") and path.endswith(suffix):
            task = path.removeprefix("results/data/").removesuffix(suffix)
            whole = size_of(config, task_file(config, task, "train"))
            if whole is None:
                return None
            held_out = math.ceil(config["data"]["validation_fraction"] * whole.lines)
            return whole.take(held_out if part == "validation" else whole.lines - held_out)
    return None


def _mixture(config: Config, name: str) -> Size | None:
    inputs = mix_inputs(config, name.removeprefix(data.MIX_PREFIX))
    sizes = [size_of(config, path) for path, _, _ in inputs]
    if any(size is None for size in sizes):
        return None
    counts = sample_counts(  # the mix command's own rule (oversampling allowed: an estimate)
        [MixInput(Path(path), kind, float(value)) for path, kind, value in inputs],
        [size.lines for size in sizes], oversample=True,
    )  # fmt: skip
    parts = [size.take(count) for size, count in zip(sizes, counts, strict=True)]
    return Size(sum(part.bytes for part in parts), sum(part.lines for part in parts))
