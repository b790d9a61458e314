"""A failed write of a checkpoint (disk full, quota, read-only) as one line, not a traceback.

torch.distributed.checkpoint wraps each rank's OSError in a `CheckpointException` (or torch.save
reports a full disk as a RuntimeError; then a probe write finds the cause); the HF export raises
the OSError itself. Either way the run stops with a `UserError` naming what was being
written and why, after rank 0 removed the partial temporary folders (the job holds the output
folder's lock, so every temporary folder there is its own). The states already on disk stay,
and the line says what to run next (`next_step`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mini_trainer.distributed.runtime import Runtime, decided_on_main
from mini_trainer.errors import UserError, error_chain
from mini_trainer.training.checkpoint import remove_stale_temp_dirs
from mini_trainer.training.run_folder import state_dirs


def find_os_error(error: BaseException) -> OSError | None:
    """The OSError behind `error` (itself, its cause or context, or a DCP rank failure)."""
    return next((e for e in error_chain(error) if isinstance(e, OSError)), None)


PROBE_BYTES = 1 << 20


def probe_write(folder: Path) -> OSError | None:
    """The OSError a 1 MiB write into `folder` gets now, or None if it succeeds.

    torch.save reports a full disk as a RuntimeError from its zip writer ("unexpected pos"),
    with no OSError to find; a write that fails right after says what the real cause was.
    """
    try:
        with tempfile.TemporaryFile(dir=folder) as handle:
            handle.write(b"\0" * PROBE_BYTES)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        return error
    return None


def _reason(error: BaseException, out_dir: Path) -> str | None:
    """Why the write failed ("No space left on device"), or None when it was no OSError."""
    os_error = find_os_error(error) or probe_write(out_dir)
    return None if os_error is None else (os_error.strerror or str(os_error))


@contextlib.contextmanager
def write_errors(out_dir: Path, what: str, runtime: Runtime) -> Iterator[None]:
    """Turn an OSError while writing `what` into a one-line `UserError`, cleaning up first.

    DCP raises its `CheckpointException` on every rank at once (it gathers the ranks' write
    failures): rank 0 then finds the cause, before it removes anything, and every rank gets its
    answer, so no rank probes a disk that rank 0's clean-up has just freed and crashes with a
    traceback instead. A failure of one rank alone is explained by that rank. A write failure
    that is no OSError stays a crash, as an `Exception` (the worker's report prints it once).
    """
    try:
        yield
    except BaseException as error:  # DCP's CheckpointException is a BaseException
        if isinstance(error, (KeyboardInterrupt, SystemExit, UserError)):
            raise
        if type(error).__name__ == "CheckpointException":  # every rank is here: decide once
            reason = decided_on_main(functools.partial(_reason, error, out_dir), runtime)
        else:
            reason = _reason(error, out_dir)
        if reason is None:
            if isinstance(error, Exception):
                raise
            raise RuntimeError(f"writing {what} failed: {error}") from error
        if runtime.is_main:
            remove_stale_temp_dirs(out_dir)
        advice = next_step(out_dir)
        raise UserError(f"{out_dir}: writing {what} failed: {reason} ({advice})") from None


def next_step(out_dir: Path) -> str:
    """What to run after a failed write, by what the next command will accept (run_folder.py):
    with a saved state, `--resume` continues from it; without one, `--resume auto` keeps this
    attempt aside and starts over (`--resume` alone would refuse the folder)."""
    if state_dirs(out_dir):
        return (
            "partial files removed; the states already saved are kept: make room and run "
            "again with --resume"
        )
    return (
        "partial files removed; no state was saved, so the run cannot continue: make room and "
        "run again with --resume auto, which keeps this attempt aside and starts over"
    )
