"""Split a validation set off a training file: seeded, deterministic, never an eval sample.

`mini-trainer split-validation` (the pipeline's `split_validation` rule) writes two files: the
training file without the chosen lines, and the chosen lines. Which lines are chosen depends only
on the file, the fraction and the seed. A line whose `input_ids` also occur in the excluded
(eval) file is never chosen, so validation during training never peeks at the evaluation.
Lines are copied byte for byte, in their original order (two streaming passes); both outputs
are checked afterwards by `validate` like any data (the split itself only reads `input_ids`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np

from mini_trainer.data.lines import iter_lines
from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_path


def sample_key(path: Path, number: int, line: bytes) -> bytes | None:
    """A digest of the line's `input_ids` (None for a blank line); a bad line is one error."""
    if not line.strip():
        return None
    try:
        ids = json.loads(line)["input_ids"]
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{path}:{number}: input_ids: not a JSON object with input_ids") from None
    return hashlib.blake2b(json.dumps(ids).encode(), digest_size=16).digest()


def choose_validation(keys: list[bytes | None], excluded: set[bytes], fraction: float,
                      seed: int) -> np.ndarray:  # fmt: skip
    """Sorted line indices (0-based) of the validation set: `ceil(fraction x eligible)` lines
    drawn by a seeded permutation from the lines that are not blank and not in `excluded`."""
    eligible = np.array([i for i, k in enumerate(keys) if k is not None and k not in excluded])
    count = math.ceil(fraction * len(eligible))
    chosen = np.random.default_rng(seed).permutation(eligible)[:count] if count else eligible[:0]
    return np.sort(chosen.astype(np.int64))


def split_validation(
    data: Path,
    fraction: float,
    seed: int,
    out_train: Path,
    out_validation: Path,
    exclude: Path | None = None,
) -> tuple[int, int]:
    """Write the two files atomically; return (training lines, validation lines)."""
    if not 0.0 < fraction < 1.0:
        raise UserError(f"--fraction: must be between 0 and 1 (exclusive), got {fraction}")
    excluded = set()
    if exclude is not None:
        excluded = {k for n, _, line in iter_lines(exclude) if (k := sample_key(exclude, n, line))}
    # Two passes: only a 16-byte digest per line stays in memory, however large the file.
    keys = [sample_key(data, number, line) for number, _, line in iter_lines(data)]
    chosen = choose_validation(keys, excluded, fraction, seed)
    remaining = sum(k is not None for k in keys) - len(chosen)
    if len(chosen) == 0 or remaining == 0:
        raise UserError(
            f"{data}: --fraction {fraction}: leaves {len(chosen)} validation and {remaining} "
            "training samples; both need at least one"
        )
    picked = set(chosen.tolist())
    with (
        atomic_path(out_validation) as val_tmp,
        atomic_path(out_train) as train_tmp,
        open(val_tmp, "wb") as val_file,
        open(train_tmp, "wb") as train_file,
    ):
        for number, _, line in iter_lines(data):
            (val_file if number - 1 in picked else train_file).write(line + b"\n")
        for handle in (val_file, train_file):
            handle.flush()
            os.fsync(handle.fileno())
    return len(keys) - len(picked), len(picked)
