"""The lengths index on disk: a parquet file that knows which data file it describes.

The schema metadata records the data file's path, size, modification time and a hash of its
first and last MiB. `read_index` refuses an index whose data file no longer has that size and
hash (regenerated, truncated, appended to): training on a stale index would read garbage at the
recorded byte offsets. The modification time is recorded but not compared, so a copy of the
data (which gets a new mtime) still matches its index.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_path, hash_file

if TYPE_CHECKING:
    import pandas as pd

INDEX_COLUMNS = ("line", "offset", "nbytes", "len", "loss_tokens")
METADATA_KEY = b"mini_trainer.index"
FORMAT_VERSION = 1
EDGE_BYTES = 1 << 20


def fingerprint(path: str | os.PathLike) -> dict:
    """Size, mtime and a blake2b hash of the first and last MiB of `path` (cheap, any size)."""
    path = Path(path)
    stat = path.stat()
    ranges = [(0, EDGE_BYTES)]
    if stat.st_size > EDGE_BYTES:
        ranges.append((max(EDGE_BYTES, stat.st_size - EDGE_BYTES), EDGE_BYTES))
    digest = hash_file(hashlib.blake2b(digest_size=16), path, ranges)
    return {
        "path": str(path.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "edge_hash": digest.hexdigest(),
    }


def check_columns(index: pd.DataFrame, where: str) -> None:
    """Raise `UserError` unless `index` has the index columns, as integers."""
    missing = [c for c in INDEX_COLUMNS if c not in index.columns]
    if missing:
        raise UserError(f"{where}: not a mini-trainer index (missing columns {', '.join(missing)})")
    wrong = [c for c in INDEX_COLUMNS if not np.issubdtype(index[c].dtype, np.integer)]
    if wrong:
        raise UserError(f"{where}: index columns {', '.join(wrong)} are not integers")


def write_index(df: pd.DataFrame, summary: dict, out_index, out_summary) -> None:
    """Write the parquet index and the JSON summary; both appear complete or neither does.

    `summary["data_fingerprint"]` (set by `build_index`) goes into the parquet schema metadata.
    """
    # deferred: pyarrow; the CLI imports this module for every command
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_columns(df, "index")
    metadata = {
        "format": FORMAT_VERSION,
        "data": summary["data_fingerprint"],
        "vocab_size": summary.get("vocab_size"),
        "max_tokens_per_gpu": summary.get("max_tokens_per_gpu"),
    }
    table = pa.Table.from_pandas(
        df[list(INDEX_COLUMNS)].astype("int64"), preserve_index=False
    ).replace_schema_metadata({METADATA_KEY: json.dumps(metadata).encode()})
    with atomic_path(out_index) as index_tmp, atomic_path(out_summary) as summary_tmp:
        pq.write_table(table, index_tmp)
        summary_tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def read_index_metadata(index_path: str | os.PathLike) -> dict:
    """The metadata `write_index` stored, or `UserError` if the file is not such an index."""
    # deferred: pyarrow (see write_index)
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(index_path)
    except (OSError, ValueError) as error:
        raise UserError(f"{index_path}: cannot read the index: {error}") from None
    raw = (schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise UserError(f"{index_path}: not an index written by `mini-trainer validate`")
    return json.loads(raw)


def index_fit_problem(
    metadata: dict, longest: int, model_vocab: int, max_tokens_per_gpu: int
) -> str | None:
    """Why an index (its metadata and longest sample) cannot serve a run, or None.

    The one rule for "does this index fit": its token ids were checked against a vocabulary no
    larger than the model's, and no sample is longer than the run's token cap.
    """
    checked = metadata.get("vocab_size")
    if checked is None or checked > model_vocab:
        return (
            f"token ids were checked against a vocabulary of {checked}, but the model has "
            f"{model_vocab} (validate with this model)"
        )
    if longest > max_tokens_per_gpu:
        return (
            f"holds a {longest}-token sample, more than --max-tokens-per-gpu "
            f"{max_tokens_per_gpu} (validate with that cap)"
        )
    return None


def stale_reason(recorded: dict, data_path: str | os.PathLike) -> str | None:
    """Why the data file no longer matches the recorded fingerprint, or None if it does."""
    current = fingerprint(data_path)
    if current["size"] != recorded["size"]:
        return f"it has {current['size']} bytes, the index was built for {recorded['size']}"
    if current["edge_hash"] != recorded["edge_hash"]:
        return "its content changed since the index was built"
    return None


def read_index(index_path: str | os.PathLike, data_path: str | os.PathLike) -> pd.DataFrame:
    """Read an index and check that it still describes `data_path`; `UserError` otherwise."""
    # deferred: pyarrow (see write_index)
    import pyarrow.parquet as pq

    metadata = read_index_metadata(index_path)
    if metadata.get("format") != FORMAT_VERSION:
        raise UserError(f"{index_path}: index format {metadata.get('format')} is not supported")
    reason = stale_reason(metadata["data"], data_path)
    if reason:
        raise UserError(
            f"{index_path}: stale index for {data_path}: {reason} "
            f"(built for {metadata['data']['path']}); rerun `mini-trainer validate`"
        )
    df = pq.read_table(index_path).to_pandas()
    check_columns(df, str(index_path))
    return df
