"""A launched worker does not outlive its launcher.

torchrun's elastic agent (in `mini-trainer train --nproc-per-node`, `launch`, or plain torchrun)
is each worker's parent. If the agent is killed outright (SIGKILL, the OOM killer), nothing
forwards a signal, and the workers would train to the end on their own while the run lock keeps
everyone else out. Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`) makes the kernel send
the worker SIGTERM when its parent dies: the worker then stops as on any SIGTERM (finish the
step, save a state, exit 75), so the run resumes exactly with `--resume`.

The same holds one level up, for the pipeline: a job started by Snakemake's train rule stops
(state saved, exit 75) when that Snakemake ends (`STOP_WITH_ENV`).

The other way round, a worker whose peer died (another host's processes killed) fails in its
next collective; `lost_peer` turns that into one line instead of the collective's traceback.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import signal
import sys
import threading

from mini_trainer.errors import error_chain

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


STOP_WITH_ENV = "MINI_TRAINER_STOP_WITH_PID"
"""A process id (on this host) whose end stops the job as a SIGTERM would: the pipeline's train
rule sets it to the Snakemake that runs the rule (`$PPID` of the rule's shell). Killing
Snakemake alone (local execution) would otherwise leave the job training, unsupervised, while
its lock keeps a rerun out; the parent-death signal cannot help, since the job's parent is the
rule's shell, which outlives Snakemake."""


@contextlib.contextmanager
def stop_when_gone(pid: int | None, signum: int = signal.SIGTERM):
    """While the block runs, send this process `signum` once process `pid` has ended (at once
    if it already has); `pid` None watches nothing.

    A daemon thread waits on a pidfd (Linux 5.3+; it names the process itself, so a reused pid
    cannot fool it), or else polls the pid every second. The signal is handled as the user's
    own would be: the launcher forwards it to the workers, which finish the step, save, and
    exit 75. The watch ends with the block, so a caller that goes on is never signalled."""
    if pid is None:
        yield
        return
    done = threading.Event()

    def wait() -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            fd = None  # already gone
        except (OSError, AttributeError):  # no pidfd here: poll the pid
            fd = -1
        if fd is not None and fd >= 0:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not done.is_set() and not poller.poll(500):
                pass
            os.close(fd)
        elif fd == -1:
            while not done.wait(1.0) and _alive(pid):
                pass
        if done.is_set():
            return
        print(
            f"warning: the process {pid} that started this job ({STOP_WITH_ENV}) ended: "
            f"stopping as on {signal.Signals(signum).name}",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=wait, name="stop-when-gone", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def env_stop_pid() -> int | None:
    """The process id `STOP_WITH_ENV` names, or None (unset, or not a pid: it is set by the
    pipeline, never by hand)."""
    value = os.environ.get(STOP_WITH_ENV, "").strip()
    return int(value) if value.isdigit() and int(value) > 1 else None


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
    for current in error_chain(error):
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
    return None
