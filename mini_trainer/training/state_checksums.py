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

The ranks share the hashing, at save time and at resume time alike (each hashes a part of the
files, biggest first): at resume every rank verifies its share of the state it is about to
read, with its own view of the file system, and the verdicts are gathered, so a mismatch seen
by any rank is the same fallback (or refusal) on every rank as one seen by rank 0
(`verify_shared`; rank 0 still decides which state to load, from these verdicts).
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


def write_checksums(folder: Path, runtime: Runtime, group=None) -> None:
    """Every rank: hash a share of `folder`'s files; rank 0 writes `checksums.json` last.

    Call when every other file of the state is written and synced (after a barrier). `group`:
    the process group of the collectives (a background save's own; None: the default).
    """
    # a lone process (world of one, tests, tools) hashes everything itself, with no collective
    grouped = dist.is_initialized() and runtime.world_size > 1
    files = listed_files(folder) if runtime.is_main else None
    if grouped:
        files = broadcast_object(files, runtime, group)
    mine = {
        name: {"size": size, ALGORITHM: file_digest(folder / name, ALGORITHM)}
        for name, size in files[runtime.rank :: runtime.world_size]
    }
    shares: list[dict | None] = [mine]
    if grouped:
        shares = [None] * runtime.world_size
        dist.all_gather_object(shares, mine, group=group)
    if runtime.is_main:
        table = {name: entry for share in shares for name, entry in (share or {}).items()}
        text = json.dumps({"algorithm": ALGORITHM, "files": dict(sorted(table.items()))}, indent=1)
        atomic_write_text(folder / CHECKSUMS, text, fsync=True)


def verify(folder: Path) -> str | None:
    """Why the files of `folder` do not match its `checksums.json`, or None when they all do."""
    table, problem = _read_table(folder)
    if problem is not None:
        return problem
    algorithm, entries = table
    return _check(folder, entries, algorithm)


def verify_shared(folder: Path, runtime: Runtime | None) -> str | None:
    """`verify`, its hashing shared by every rank of the job; the same answer on every rank.

    Call on every rank together. Each rank reads the table itself and hashes its share of the
    files (biggest first, as at save); the first problem found, in rank order, is everyone's
    (a rank other than 0 is named in it). A lone process verifies everything itself."""
    if runtime is None or runtime.world_size <= 1 or not dist.is_initialized():
        return verify(folder)
    table, problem = _read_table(folder)
    if problem is None:
        algorithm, entries = table
        ordered = sorted(entries, key=lambda item: (-_recorded_size(item[1]), item[0]))
        problem = _check(folder, ordered[runtime.rank :: runtime.world_size], algorithm)
    problems: list[str | None] = [None] * runtime.world_size
    dist.all_gather_object(problems, problem)
    for rank, found in enumerate(problems):
        if found is not None:
            return found if rank == 0 else f"{found} (seen by rank {rank})"
    return None


def _recorded_size(entry) -> int:
    try:
        return int(entry["size"])
    except (KeyError, TypeError, ValueError):
        return 0


def _read_table(folder: Path) -> tuple[tuple[str, list] | None, str | None]:
    """((algorithm, [(name, entry)...]), None), or (None, why the table is unusable)."""
    try:
        recorded = json.loads((folder / CHECKSUMS).read_text())
        algorithm = recorded["algorithm"]
        entries = sorted(recorded["files"].items())
    except FileNotFoundError:
        return None, f"{CHECKSUMS} is missing"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return None, f"{CHECKSUMS} does not load ({type(error).__name__})"
    if algorithm not in FILE_DIGESTS:
        return None, f"{CHECKSUMS}: unknown algorithm {algorithm!r}"
    return (algorithm, entries), None


def _check(folder: Path, entries: list, algorithm: str) -> str | None:
    """The first of `entries` whose file is missing or differs, as one reason; else None."""
    for name, entry in entries:
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        try:
            if size != entry["size"]:
                return f"{name} has {size} bytes, {CHECKSUMS} says {entry['size']}"
            if file_digest(path, algorithm) != entry[algorithm]:
                return f"{name}: content differs from {CHECKSUMS} ({algorithm})"
        except (KeyError, TypeError):
            return f"{CHECKSUMS}: the entry of {name} does not load"
        except OSError as error:
            return f"{name} does not read ({error.strerror or type(error).__name__})"
    return None
