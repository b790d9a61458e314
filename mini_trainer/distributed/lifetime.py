"""A launched worker does not outlive its launcher.

torchrun's elastic agent (in `mini-trainer train --nproc-per-node`, `launch`, or plain torchrun)
is each worker's parent. If the agent is killed outright (SIGKILL, the OOM killer), nothing
forwards a signal, and the workers would train to the end on their own while the run lock keeps
everyone else out. Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`) makes the kernel send
the worker SIGTERM when its parent dies: the worker then stops as on any SIGTERM (finish the
step, save a state, exit 75), so the run resumes exactly with `--resume`.
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
