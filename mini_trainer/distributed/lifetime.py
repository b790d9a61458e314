"""A launched worker does not outlive its launcher.

torchrun's elastic agent (in `mini-trainer train --nproc-per-node`, `launch`, or plain torchrun)
is each worker's parent. If the agent is killed outright (SIGKILL, the OOM killer), nothing
forwards a signal, and the workers would train to the end on their own while the run lock keeps
everyone else out. Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`) makes the kernel send
the worker SIGTERM when its parent dies: the worker then stops as on any SIGTERM (finish the
step, save a state, exit 75), so the run resumes exactly with `--resume`.

The other way round, a worker whose peer died (another host's processes killed) fails in its
next collective; `lost_peer` turns that into one line instead of the collective's traceback.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def stop_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Ask the kernel for `signum` when this process's parent dies; False where unsupported.

    Must run in the process's main thread at start-up; a parent already gone by then (the
    race between fork and this call) gets the signal sent here at once.
    """
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent or parent == 1:  # orphaned before the request took effect
        os.kill(os.getpid(), signum)
    return True


LOST_PEER_SIGNS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "socket closed",
)
"""How gloo (and the c10d store) word a peer process that is gone: its sockets were closed
by the kernel when it died (SIGKILL, the OOM killer, a host that went down)."""


RESUME_EVERYWHERE = (
    "run the same command with --resume on every host to continue from the last saved state"
)
"""The advice after losing part of a multi-process job."""


def lost_rendezvous(error: BaseException, endpoint: str) -> str:
    """One line for a launcher whose rendezvous store went away mid-job: the host serving it
    (`--rdzv-endpoint`, node rank 0 under `--rdzv-conf is_host=true`) died or became
    unreachable. torchrun's agent raises a RendezvousError with a traceback."""
    cause = error.__cause__ or error.__context__
    source = cause if cause is not None and str(cause).strip() else error
    reason = (str(source).strip().splitlines() or [type(error).__name__])[0]
    return (
        f"lost contact with the rendezvous host {endpoint} ({reason}): its processes or the "
        f"network stopped; {RESUME_EVERYWHERE}"
    )


def lost_peer(error: BaseException) -> str | None:
    """One line for a worker whose peer died mid-job, or None for any other error.

    A killed rank is no bug of the survivors: each would otherwise print the traceback of the
    collective it was in. Looks through the error's causes and DCP's per-rank failures.
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        text = str(current).strip()
        if any(sign in text.lower() for sign in LOST_PEER_SIGNS):
            reason = text.splitlines()[0]
            if reason.startswith("[") and "] " in reason:  # gloo's "[file.cc:123] " prefix
                reason = reason.split("] ", 1)[1]
            reason = reason.split(". This is typically")[0]  # gloo's advice: not for a kill
            return (
                f"lost contact with another process of this job ({reason}): a process or "
                f"host died or the network failed; {RESUME_EVERYWHERE}"
            )
        todo += [current.__cause__, current.__context__]
        failures = getattr(current, "failures", None)  # CheckpointException: rank -> error
        if isinstance(failures, dict):
            for failure in failures.values():  # (exception, traceback) pairs
                first = failure[0] if isinstance(failure, tuple) and failure else failure
                if isinstance(first, BaseException):
                    todo.append(first)
    return None
