"""One job per output folder: an exclusive lock on `OUT/.lock`, held for the job's life.

Two jobs writing one folder (a second submission, or a second `--resume` while the first still
runs) would interleave metrics and prune each other's states. Rank 0 takes a `flock` on
`OUT/.lock` before anything else happens; a second job's rank 0 finds it taken and every rank
of that job stops at once with one line. The kernel drops the lock when the process ends, even
after SIGKILL, so a crashed job never leaves a stale lock behind. (`flock` on a network file
system works only where the file system supports it: NFSv4 and Lustre with `flock` do.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path

from mini_trainer.distributed.runtime import Runtime, broadcast_object
from mini_trainer.errors import UserError

LOCK_NAME = ".lock"
_held: list[int] = []  # descriptors kept open (and so locked) until the process exits
_created: list[Path] = []  # folders the lock created: removed at release if still bare


def try_lock(out_dir: Path) -> str | None:
    """Lock `out_dir/.lock` for this process; None on success, else why not (one line)."""
    try:
        if not out_dir.exists():
            out_dir.mkdir(parents=True, exist_ok=True)
            _created.append(out_dir)
        fd = os.open(out_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        return f"{out_dir}: --output-dir: cannot create a lock file there ({error.strerror})"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        problem = _busy(out_dir, fd)
        os.close(fd)
        return problem
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    _held.append(fd)
    return None


def _busy(out_dir: Path, fd: int) -> str:
    """The one line for a folder whose lock (open as `fd`) another job holds."""
    holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
    return (
        f"{out_dir}: --output-dir is in use by another training job ({holder}); "
        "wait for it to end or choose another folder"
    )


def in_use(out_dir: Path) -> str | None:
    """Why `out_dir` cannot be trained in now (a job holds its lock), or None; creates nothing.

    For the launcher's checks before any worker starts: the workers' rank 0 still takes the
    lock itself (two launches at the same instant both pass this check; one lock wins)."""
    try:
        fd = os.open(out_dir / LOCK_NAME, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _busy(out_dir, fd)
    finally:
        os.close(fd)  # closing drops a lock taken here
    return None


def lock_output_dir(out_dir: Path, runtime: Runtime) -> None:
    """Rank 0 locks the folder for the job's life; every rank raises `UserError` if it cannot."""
    problem = try_lock(out_dir) if runtime.is_main else None
    problem = broadcast_object(problem, runtime)
    if problem:
        raise UserError(problem)


def release() -> None:
    """Drop this process's locks (the end of the process does it too).

    A folder the lock created that still holds nothing but `.lock` (the job was refused before
    it wrote anything: a bad validation file, a bad data line) is removed first, while still
    locked: a refusal leaves no `.lock`-only folder behind."""
    while _created:
        folder = _created.pop()
        with contextlib.suppress(OSError):
            if [path.name for path in folder.iterdir()] == [LOCK_NAME]:
                (folder / LOCK_NAME).unlink()
                folder.rmdir()
    while _held:
        os.close(_held.pop())
