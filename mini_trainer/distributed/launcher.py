"""torchrun's launcher for the training job, with one clean outcome.

`mini-trainer train --nproc-per-node N`, `mini-trainer launch` and `run_training` all start the
workers here (`supervise`, called by `train.launch` once the flags are checked; a bad flag is one
line, before any worker starts). Plain torchrun exits 1 whatever its workers returned, prints
its own traceback after theirs, shows only some ranks' output, and dies on SIGUSR1 leaving its
workers orphaned. This module runs the same elastic agent in-process (`torch.distributed.run`'s
own argument parsing and `elastic_launch`), and:
- forwards SIGTERM, SIGINT and SIGUSR1 to every worker (they finish the step, save, exit 75);
- has workers write a report instead of printing their error (`write_report`, in a per-launch
  folder named by `REPORT_DIR_ENV`), then prints each distinct error line once, whichever rank
  raised it, and exits with the documented status (`exit_status`).

Exit statuses (docs/training.md): 0 done; 2 a user error (bad flag, data, model, folder);
3 training diverged (non-finite loss, gradient norm or weights); 75 stopped by a signal with a
state saved (run again with --resume); 1 anything else (a crash: the first failing rank's
traceback is printed once).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from mini_trainer.distributed.lifetime import env_stop_pid, lost_rendezvous, stop_when_gone
from mini_trainer.distributed.preemption import EXIT_PREEMPTED

if TYPE_CHECKING:
    from mini_trainer.launch_args import TorchrunArgs

from mini_trainer.io_utils import atomic_write_text

REPORT_DIR_ENV = "MINI_TRAINER_REPORT_DIR"
FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
SHUTDOWN_TIMEOUT_S = 300
"""How long workers get to finish their step and save after a stop signal, before SIGKILL."""
EXIT_CRASH = 1
REPRODUCIBLE_MKL = ("MKL_CBWR", "AUTO,STRICT")
"""MKL's conditional numerical reproducibility, strict mode: the same results for the same
inputs whatever the arrays' memory alignment (without it, some kernels take other code paths
for unaligned data, which can change the last bits between two runs of one command). The CPU
path's cost: docs/benchmarks.md. A value the user set is kept."""


def write_report(
    rank: int, exit_code: int, lines=(), traceback: str | None = None, lost_peer: bool = False
) -> bool:
    """In a launched worker: record why this rank exits non-zero; False when not launched.

    `lost_peer`: this rank failed only because another one died (its `lines` say so)."""
    folder = os.environ.get(REPORT_DIR_ENV)
    if not folder:
        return False
    report = {"rank": rank, "exit": exit_code, "lines": list(lines), "time": time.time()}
    if traceback:
        report["traceback"] = traceback
    if lost_peer:
        report["lost_peer"] = True
    atomic_write_text(Path(folder) / f"rank{rank}.json", json.dumps(report))
    return True


def read_reports(folder: str | os.PathLike) -> list[dict]:
    """The workers' reports, oldest first."""
    reports = []
    for path in Path(folder).glob("rank*.json"):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(reports, key=lambda report: report["time"])


def exit_status(reports: list[dict], failures: dict[int, int]) -> tuple[int, list[str]]:
    """(exit status, lines to print once) from the workers' reports and exit codes.

    A user error anywhere wins over the crashes it causes on the other ranks (they lose their
    peer); then a preemption (75); then the first crash; then a rank killed by a signal; then
    a rank that lost its peer (another host's rank died); then any other failing exit code.
    """
    peer_lost = [report for report in reports if report.get("lost_peer")]
    reports = [report for report in reports if not report.get("lost_peer")]
    with_lines = [report for report in reports if report["lines"]]
    if with_lines:
        seen: dict[str, None] = {}
        for report in with_lines:
            for line in report["lines"]:
                seen.setdefault(f"error: {line}", None)
        return with_lines[0]["exit"], list(seen)
    if any(report["exit"] == EXIT_PREEMPTED for report in reports):
        return EXIT_PREEMPTED, []
    crashes = [report for report in reports if report.get("traceback")]
    if crashes:
        first = crashes[0]
        return EXIT_CRASH, [f"error: rank {first['rank']} crashed:", first["traceback"].rstrip()]
    failed = {rank: code for rank, code in failures.items() if code != 0}
    if -1 in failed:  # the launcher itself was signalled and no worker reported a save
        name = signal.Signals(-failed[-1]).name
        return 128 - failed[-1], [f"error: stopped by {name}; no worker reported a saved state"]
    if peer_lost and not any(code < 0 for code in failed.values()):
        return EXIT_CRASH, [f"error: {peer_lost[0]['lines'][0]}"]
    if failed:
        rank, code = min(failed.items(), key=lambda item: (item[1] >= 0, item[0]))
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
        return EXIT_CRASH, [f"error: rank {rank} {how} (out of memory?)"]
    return 0, []


CPP_LOG_LEVEL_ENV = "TORCH_CPP_LOG_LEVEL"


def import_torch_quietly() -> None:
    """Import torch in the launcher with c10's C++ warnings off (errors still print), the
    workers' environment left as the user's.

    When the host serving the rendezvous store dies, the agent's store client logs each failed
    socket call as a C++ warning with a 50-frame stack before the one-line outcome; the
    launcher's other C++ warnings (no reverse DNS for a peer) are as idle. c10 reads the level
    once, when torch loads, so it is set just for that import and removed before any worker
    starts. No effect where torch is already imported or the user chose a level."""
    if "torch" in sys.modules or CPP_LOG_LEVEL_ENV in os.environ:
        return
    os.environ[CPP_LOG_LEVEL_ENV] = "ERROR"
    try:
        import torch  # noqa: F401  # deferred: the point of this function
    finally:
        del os.environ[CPP_LOG_LEVEL_ENV]


WORKER_MODULE = "mini_trainer.train"
"""The module each worker runs (`python -m mini_trainer.train FLAGS`)."""


def worker_argv(torchrun_args: TorchrunArgs, train_flags: list[str]) -> list[str]:
    """torchrun's arguments for the training job: its settings, then the worker and its flags.

    The one place that builds the worker command: the launcher runs it, `launch --dry-run`
    prints it (`torchrun_command`)."""
    return [*torchrun_args.to_cli_args(), "-m", WORKER_MODULE, *train_flags]


def torchrun_command(
    torchrun_args: TorchrunArgs, train_flags: list[str], python: str = sys.executable
) -> list[str]:
    """`PYTHON -m torch.distributed.run TORCHRUN_ARGS -m mini_trainer.train TRAIN_FLAGS`."""
    return [python, "-m", "torch.distributed.run", *worker_argv(torchrun_args, train_flags)]


def supervise(torchrun_args: TorchrunArgs, train_flags: list[str]) -> tuple[int, list[str]]:
    """Run the training job on this node's workers with torchrun's elastic agent in this
    process; return the job's exit status and the lines it printed. The flags are not checked
    here: `train.launch` checks them first (the one launch path of `train --nproc-per-node`,
    `launch` and `run_training`)."""
    # deferred: torch (workers import this module for write_report before their flags are read)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    parsed = parse_args(
        [
            *("--signals-to-handle", FORWARDED_SIGNALS),
            *("--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)),
            *worker_argv(torchrun_args, train_flags),
        ]
    )
    if parsed.standalone:  # what torch.distributed.run.run does before config_from_args
        parsed.rdzv_backend, parsed.rdzv_endpoint = "c10d", "localhost:0"
        parsed.rdzv_id = str(uuid.uuid4())
    if parsed.master_port is None:
        parsed.master_port = 29500
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its banner
    os.environ.setdefault(*REPRODUCIBLE_MKL)  # read by MKL in each worker when it starts
    # torchrun's warnings about the flags built here (--node-rank is ignored by c10d) and the
    # agent's own log lines (worker started, signal forwarded, "failed (exitcode: 2)") say
    # nothing the outcome below does not; their errors still show.
    logging.getLogger("torch.distributed.run").setLevel(logging.ERROR)
    for name in [*logging.Logger.manager.loggerDict, "torch.distributed.elastic"]:
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    config, command, command_args = config_from_args(parsed)
    failures: dict[int, int] = {}
    lost: str | None = None
    with tempfile.TemporaryDirectory(prefix="mini-trainer-reports-") as folder:
        os.environ[REPORT_DIR_ENV] = folder
        try:
            with stop_when_gone(env_stop_pid()):  # the pipeline's Snakemake, when it set one
                elastic_launch(config, command)(*command_args)
        except ChildFailedError as error:
            failures = {rank: failure.exitcode for rank, failure in error.failures.items()}
        except SignalException as error:
            # Forwarded to the workers, which saved and reported (or were killed after the
            # shutdown timeout, which the reports then lack).
            failures = {-1: -int(error.sigval)}
        except RendezvousError as error:  # the host serving the rendezvous store is gone
            lost = lost_rendezvous(error, parsed.rdzv_endpoint)
        finally:
            os.environ.pop(REPORT_DIR_ENV, None)
        status, lines = exit_status(read_reports(folder), failures)
    if lost is not None and status in (0, 1):  # a rank's user error or stop says more
        status, lines = 1, [f"error: {lost}"]
    for line in lines:
        print(line, file=sys.stderr)
    return status, lines
