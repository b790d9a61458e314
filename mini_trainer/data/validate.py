"""`mini-trainer validate`: check every line of a pre-tokenized JSONL file, build its index.

The file is streamed once, one line in memory at a time; what grows with the file is only the
index itself (five int64 columns, 40 bytes per sample). Every problem is reported as
`FILE:LINE: FIELD: reason` (see `checks.check_line`); any problem means no index at all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mini_trainer.data.index_file import INDEX_COLUMNS, fingerprint, write_index
from mini_trainer.data.mix import line_sources
from mini_trainer.data.problems import ProblemLog
from mini_trainer.data.scan import LONG_FLAG, scan_file
from mini_trainer.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["build_index", "read_vocab_size", "summary_text", "write_index"]

ON_LONG = ("error", "drop")
VALIDATE_LONG_HINT = (
    "samples longer than --max-tokens-per-gpu: {count}; pass --on-long drop to leave them "
    "out of the index (they are counted in the summary)"
)
PERCENTILES = (50, 90, 95, 99)


def read_vocab_size(model_path: str | os.PathLike) -> int:
    """The model's vocabulary size from its `config.json`, without loading any weights.

    Multimodal configs keep it under `text_config`; that is used when the top level has none.
    """
    config_path = Path(model_path) / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"{model_path}: no config.json (expected a Hugging Face model folder)"
        ) from None
    except (OSError, ValueError) as error:
        raise UserError(f"{config_path}: cannot read the model config: {error}") from None
    vocab_size = config.get("vocab_size") if isinstance(config, dict) else None
    if vocab_size is None and isinstance(config, dict):
        vocab_size = (config.get("text_config") or {}).get("vocab_size")
    if type(vocab_size) is not int or vocab_size <= 0:
        raise UserError(f"{config_path}: vocab_size: missing or not a positive integer")
    return vocab_size


def _length_stats(lengths: np.ndarray) -> dict:
    stats = {"min": int(lengths.min()), "mean": round(float(lengths.mean()), 2)}
    for q, value in zip(
        PERCENTILES, np.percentile(lengths, PERCENTILES, method="higher"), strict=True
    ):
        stats[f"p{q}"] = int(value)
    stats["max"] = int(lengths.max())
    return stats


def build_index(
    data_path: str | os.PathLike,
    vocab_size: int,
    max_tokens: int,
    on_long: str = "error",
    progress: bool | None = None,
    workers: int | None = None,
    long_hint: str = VALIDATE_LONG_HINT,
    outcome: str | None = "no index written",
    cap_flag: str = "--max-tokens-per-gpu",
) -> tuple[pd.DataFrame, dict]:
    """Check every line of `data_path`; return the index and a summary, or raise `UserError`.

    Index columns (int64): `line` (1-based), `offset` (byte offset of the line), `nbytes` (bytes
    of the line without its `\\n`), `len` (tokens), `loss_tokens` (labels != -100 at positions
    t >= 1). Samples longer than `max_tokens` are an error, or dropped and counted when
    `on_long` is "drop". `progress=None` shows a bar only when stderr is a terminal; `workers`
    processes check the file (default: the usable CPUs, up to 8; small files use one).
    `long_hint` (its "{count}" replaced by the number) ends the error when samples are over
    the cap: the remedy depends on the command that called. `outcome` ends the total line
    (None: the caller writes no index, so a single problem is its one line). `cap_flag` is the
    option that set `max_tokens` (training's validation file has its own), named wherever a
    sample over it is reported.
    """
    if on_long not in ON_LONG:
        raise ValueError(f"on_long must be one of {ON_LONG}, got {on_long!r}")
    scan = scan_file(data_path, vocab_size, max_tokens, on_long, workers, progress)
    log = ProblemLog(str(data_path))
    source = line_sources(data_path, scan.lines) if scan.problems else None
    for number, field, reason in scan.problems:
        reason = reason.replace(LONG_FLAG, cap_flag)
        log.add(number, field, f"{reason} (from {source(number)})" if source else reason)
    log.count += scan.problem_count - len(scan.problems)  # found but not kept for printing
    dropped, total_lines = scan.dropped, scan.lines
    data_fingerprint = fingerprint(data_path)
    if total_lines == 0:
        log.add_file_problem("empty file (no samples)")
    elif scan.end < data_fingerprint["size"]:
        log.add_file_problem("the file grew while it was being validated")
    elif not log.count and not len(scan.rows):
        log.add_file_problem(
            f"no sample left: all {dropped} are longer than {cap_flag} {max_tokens}"
        )
    hints = [long_hint.replace("{count}", str(scan.too_long))] if scan.too_long else []
    log.raise_if_any(outcome, hints)
    # deferred: pandas; a failing run (the common interactive case) never pays for it
    import pandas as pd

    index = pd.DataFrame({name: scan.rows[:, i] for i, name in enumerate(INDEX_COLUMNS)})
    lengths = index["len"].to_numpy()
    summary = {
        "data_file": str(data_path),
        "data_fingerprint": data_fingerprint,
        "lines": total_lines,
        "samples": len(index),
        "dropped": dropped,
        "dropped_lines": scan.dropped_lines,
        "tokens": int(lengths.sum()),
        "loss_tokens": int(index["loss_tokens"].sum()),
        "length": _length_stats(lengths),
        "vocab_size": vocab_size,
        "max_tokens_per_gpu": max_tokens,
        "on_long": on_long,
    }
    return index, summary


def summary_text(summary: dict) -> str:
    """A few human lines about a validated file, for stdout."""
    length = summary["length"]
    dropped = summary["dropped"]
    return "\n".join(
        [
            f"{summary['data_file']}: {summary['samples']:,} samples"
            + (
                f", {dropped:,} dropped (longer than {summary['max_tokens_per_gpu']})"
                if dropped
                else ""
            ),
            f"  tokens {summary['tokens']:,}, loss tokens {summary['loss_tokens']:,}",
            f"  length min {length['min']}, p50 {length['p50']}, p99 {length['p99']}, "
            f"max {length['max']} (mean {length['mean']})",
            f"  token ids checked against vocab size {summary['vocab_size']}",
        ]
    )
