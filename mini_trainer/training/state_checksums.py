"""Per-file checksums of a saved state, so a resume never continues from silently changed bytes.

The damage check of `run_folder.damage` compares sizes with the DCP metadata and loads the small
files; a same-size change inside a shard (bit rot, a bad copy) passes it, and the resumed run
would end with other weights. So `checkpoint.save_state` writes `checksums.json` (size and
xxh3-64 digest of every other file in the state folder) last, through a temporary name, before
the folder is published; `verify` recomputes it on resume, and a mismatch makes the state
damaged like a truncated one (fall back to the previous intact state). The digest guards
against damage, not tampering: xxh3-64 is about 20 times faster than sha256 here, which keeps
the added save time small (benchmarks/state_checksums.py); states written with sha256 by an
earlier version are verified with sha256, as their file says.

The ranks share the hashing at save time (each hashes a part of the files, biggest first);
rank 0 verifies alone at resume time, since it alone decides which state to load.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist

from mini_trainer.distributed.runtime import Runtime, broadcast_object
from mini_trainer.io_utils import FILE_DIGESTS, atomic_write_text, file_digest

CHECKSUMS = "checksums.json"
ALGORITHM = "xxh3_64"
"""The digest new states are written with (`verify` reads any of `FILE_DIGESTS`)."""


def listed_files(folder: Path) -> list[tuple[str, int]]:
    """(name, size) of every file of the state folder but the checksums, biggest first."""
    found = [
        (path.name, path.stat().st_size)
        for path in folder.iterdir()
        if path.is_file() and path.name != CHECKSUMS and not path.name.startswith(f".{CHECKSUMS}")
    ]
    return sorted(found, key=lambda item: (-item[1], item[0]))


def write_checksums(folder: Path, runtime: Runtime) -> None:
    """Every rank: hash a share of `folder`'s files; rank 0 writes `checksums.json` last.

    Call when every other file of the state is written and synced (after a barrier).
    """
    # a lone process (world of one, tests, tools) hashes everything itself, with no collective
    grouped = dist.is_initialized() and runtime.world_size > 1
    files = listed_files(folder) if runtime.is_main else None
    if grouped:
        files = broadcast_object(files, runtime)
    mine = {
        name: {"size": size, ALGORITHM: file_digest(folder / name, ALGORITHM)}
        for name, size in files[runtime.rank :: runtime.world_size]
    }
    shares: list[dict | None] = [mine]
    if grouped:
        shares = [None] * runtime.world_size
        dist.all_gather_object(shares, mine)
    if runtime.is_main:
        table = {name: entry for share in shares for name, entry in (share or {}).items()}
        text = json.dumps({"algorithm": ALGORITHM, "files": dict(sorted(table.items()))}, indent=1)
        atomic_write_text(folder / CHECKSUMS, text, fsync=True)


def verify(folder: Path) -> str | None:
    """Why the files of `folder` do not match its `checksums.json`, or None when they all do."""
    try:
        recorded = json.loads((folder / CHECKSUMS).read_text())
        algorithm = recorded["algorithm"]
        entries = sorted(recorded["files"].items())
    except FileNotFoundError:
        return f"{CHECKSUMS} is missing"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{CHECKSUMS} does not load ({type(error).__name__})"
    if algorithm not in FILE_DIGESTS:
        return f"{CHECKSUMS}: unknown algorithm {algorithm!r}"
    for name, entry in entries:
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != entry["size"]:
            return f"{name} has {size} bytes, {CHECKSUMS} says {entry['size']}"
        if file_digest(path, algorithm) != entry[algorithm]:
            return f"{name}: content differs from {CHECKSUMS} ({algorithm})"
    return None
