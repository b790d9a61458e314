"""`mini-trainer train --nproc-per-node N ...`: torchrun's launcher, with one clean outcome.

Plain torchrun exits 1 whatever its workers returned, prints its own traceback after theirs,
shows only some ranks' output, and dies on SIGUSR1 leaving its workers orphaned. This module
runs the same elastic agent in-process (`torch.distributed.run`'s own argument parsing and
`elastic_launch`), and:
- checks the training arguments before any worker starts (a bad flag is one line, at once);
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

REPORT_DIR_ENV = "MINI_TRAINER_REPORT_DIR"
FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
SHUTDOWN_TIMEOUT_S = 300
"""How long workers get to finish their step and save after a stop signal, before SIGKILL."""
EXIT_CRASH = 1


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
    path = Path(folder) / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, path)
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
    from mini_trainer.training.preemption import EXIT_PREEMPTED

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


def pin_model_revision(args, train_argv: list[str]) -> list[str]:
    """Resolve a Hub id here, once per node before any worker starts (its errors print once),
    and hand the workers the commit, so every rank reads the same snapshot from the cache."""
    from mini_trainer.models.hub import resolve_model

    resolved = resolve_model(
        args.model_name_or_path, args.model_revision, flag="--model-name-or-path"
    )
    return (
        train_argv
        if resolved.commit is None
        else [*train_argv, "--model-revision", resolved.commit]
    )


def launch(torchrun_args, train_argv: list[str]) -> int:
    """Run the training job on this node's workers; return the job's exit status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    from mini_trainer.train import check_inputs
    from mini_trainer.training_args import parse_training_args

    args = parse_training_args(train_argv)
    check_inputs(args, torchrun_args.nproc_per_node * torchrun_args.nnodes)
    train_argv = pin_model_revision(args, train_argv)
    torchrun_argv = [
        *torchrun_args.to_cli_args(),
        *("--signals-to-handle", FORWARDED_SIGNALS),
        *("--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)),
        *("-m", "mini_trainer.train", *train_argv),
    ]
    parsed = parse_args(torchrun_argv)
    if parsed.standalone:  # what torch.distributed.run.run does before config_from_args
        parsed.rdzv_backend, parsed.rdzv_endpoint = "c10d", "localhost:0"
        parsed.rdzv_id = str(uuid.uuid4())
    if parsed.master_port is None:
        parsed.master_port = 29500
    config, command, command_args = config_from_args(parsed)
    # The agent's own log lines (worker started, signal forwarded, "failed (exitcode: 2)") say
    # nothing the outcome below does not; its errors still show.
    for name in [*logging.Logger.manager.loggerDict, "torch.distributed.elastic"]:
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    failures: dict[int, int] = {}
    with tempfile.TemporaryDirectory(prefix="mini-trainer-reports-") as folder:
        os.environ[REPORT_DIR_ENV] = folder
        try:
            elastic_launch(config, command)(*command_args)
        except ChildFailedError as error:
            failures = {rank: failure.exitcode for rank, failure in error.failures.items()}
        except SignalException as error:
            # Forwarded to the workers, which saved and reported (or were killed after the
            # shutdown timeout, which the reports then lack).
            failures = {-1: -int(error.sigval)}
        finally:
            os.environ.pop(REPORT_DIR_ENV, None)
        status, lines = exit_status(read_reports(folder), failures)
    for line in lines:
        print(line, file=sys.stderr)
    return status
