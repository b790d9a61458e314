"""A map-style dataset that reads each sample from the JSONL file by its byte offset.

Only the index (five int64 numbers per sample) lives in memory; a sample is read with one
`os.pread` when asked for, so a training process's memory does not grow with the file. `pread`
has no shared file position, so the dataset is safe to use from threads and from forked
DataLoader workers; pickling it (spawned workers) drops the descriptor, which is reopened
lazily.

The index's staleness check hashes only the file's size and first and last MiB, so a line edited
in the middle (same size) is read as is: each line read is checked again for its length and,
given the vocabulary size, for token ids and labels outside it (a min/max over the line, far
cheaper than the step), so such an edit is one `FILE:LINE` error, not an `IndexError` in the
embedding (or a device-side assert on a GPU).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from mini_trainer.data.index_file import check_columns, read_index
from mini_trainer.data.lines import count_lines
from mini_trainer.data.mix import line_sources
from mini_trainer.errors import UserError


class IndexedJsonlDataset:
    """Samples of a validated JSONL file, as `{"input_ids": [...], "labels": [...]}`."""

    def __init__(
        self, data_path: str | os.PathLike, index: pd.DataFrame, vocab_size: int | None = None
    ):
        """`index` comes from `validate.build_index` or `IndexedJsonlDataset.open`; with
        `vocab_size`, every line read is checked against it."""
        check_columns(index, "index")
        self.data_path = Path(data_path)
        self.vocab_size = vocab_size
        self._offsets = np.ascontiguousarray(index["offset"].to_numpy(dtype=np.int64))
        self._nbytes = np.ascontiguousarray(index["nbytes"].to_numpy(dtype=np.int64))
        self._lengths = np.ascontiguousarray(index["len"].to_numpy(dtype=np.int64))
        self._loss_tokens = np.ascontiguousarray(index["loss_tokens"].to_numpy(dtype=np.int64))
        self._lines = np.ascontiguousarray(index["line"].to_numpy(dtype=np.int64))
        for array in (self._lengths, self._loss_tokens, self._lines):
            array.flags.writeable = False
        self._fd: int | None = None

    @classmethod
    def open(
        cls,
        data_path: str | os.PathLike,
        index_path: str | os.PathLike,
        vocab_size: int | None = None,
    ) -> IndexedJsonlDataset:
        """Load the parquet index written by `mini-trainer validate`; refuse a stale one."""
        return cls(data_path, read_index(index_path, data_path), vocab_size)

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per sample (read-only int64 array, position i is sample i)."""
        return self._lengths

    @property
    def loss_tokens(self) -> np.ndarray:
        """Loss tokens per sample after the causal shift (read-only int64 array)."""
        return self._loss_tokens

    @property
    def line_numbers(self) -> np.ndarray:
        """1-based line of each sample in the data file (read-only int64 array)."""
        return self._lines

    def _descriptor(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.data_path, os.O_RDONLY)
        return self._fd

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        i = int(i) % len(self)
        nbytes = int(self._nbytes[i])
        raw = os.pread(self._descriptor(), nbytes, int(self._offsets[i]))
        try:
            try:
                sample = orjson.loads(raw)
            except orjson.JSONDecodeError:  # what validate accepted, the stdlib parses
                sample = json.loads(raw)
            input_ids, labels = sample["input_ids"], sample["labels"]
        except (ValueError, KeyError, TypeError):
            sample = input_ids = labels = None
        if input_ids is None or len(input_ids) != self._lengths[i] or len(raw) != nbytes:
            raise self._bad_line(
                i, "the data no longer matches its index (the file changed after validation); "
                "rerun `mini-trainer validate`",
            )  # fmt: skip
        if self.vocab_size is not None:
            problem = _token_problem(input_ids, labels, self.vocab_size)
            if problem:
                raise self._bad_line(
                    i, f"{problem} (the file changed after validation); rerun "
                    "`mini-trainer validate`",
                )  # fmt: skip
        return {"input_ids": input_ids, "labels": labels}

    def _bad_line(self, i: int, reason: str) -> UserError:
        """`FILE:LINE: reason`, and for a mixture the input line it came from, as `validate`
        names it (`mix.line_sources`, from the NAME.mix.json sidecar): the file to fix."""
        line = int(self._lines[i])
        text = f"{self.data_path}:{line}: {reason}"
        try:
            source = line_sources(self.data_path, count_lines(self.data_path))
        except OSError:
            source = None
        return UserError(f"{text} (from {source(line)})" if source else text)

    def close(self) -> None:
        """Close the file descriptor; a later `__getitem__` reopens it."""
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fd"] = None
        return state


def _token_problem(input_ids: list, labels: list, vocab_size: int) -> str | None:
    """Why a line read at training time cannot be trained on as is, or None (min/max only)."""
    try:
        ids = np.asarray(input_ids)
        targets = np.asarray(labels)
    except (ValueError, TypeError):
        return "input_ids/labels: not lists of integers"
    for name, values in (("input_ids", ids), ("labels", targets)):
        if values.dtype.kind not in "iu" or values.ndim != 1:
            return f"{name}: not a list of integers"
    if len(targets) != len(ids):
        return f"labels: {len(targets)} labels for {len(ids)} input_ids"
    if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = ids.min() if ids.min() < 0 else ids.max()
        return f"input_ids: token id {bad} is outside the vocabulary (0..{vocab_size - 1})"
    targets = targets[targets != -100]
    if len(targets) and (targets.min() < 0 or targets.max() >= vocab_size):
        bad = targets.min() if targets.min() < 0 else targets.max()
        return (
            f"labels: {bad} is neither -100 nor a token id of the vocabulary (0..{vocab_size - 1})"
        )
    return None
