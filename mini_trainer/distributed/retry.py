"""Exit statuses 2 and 3 are final, never run again; a preempted job (75) runs again as itself.

Snakemake retries every failed job (its `retries`) whatever its exit status: it has no
exit-code-aware retry. A job that ended with 2 (bad input: data, model, folder) or 3 (training
diverged) would end the same way on each retry, after a queue wait and a model load. So:

- Under Slurm the pipeline does not use Snakemake's retries (the profile's `retries: 0`): a
  training job that is preempted (exit 75: state saved) requeues its own Slurm job
  (`scontrol requeue`, `requeue_reason`), and after a crash (1) too, while the job was
  restarted fewer than `CRASH_REQUEUES` times. Slurm then starts the same job again (same id;
  Snakemake sees it pending, then running) and it resumes. A job that ended 2 or 3 is not
  requeued: it ends, Snakemake reports it failed, and nothing is submitted or started again.
  The pipeline's train rule asks for this with `REQUEUE_ENV`.
- Where Snakemake retries anyway (`--retries` given, local or Slurm), the launcher records every
  job's outcome in `OUT/last_exit.json` (`record_exit`), the train rule passes Snakemake's
  attempt number in `ATTEMPT_ENV`, and a retry (attempt 2 or more) of a job whose last outcome
  was 2 or 3 stops before any worker starts, with that status and the lines it ended with
  (`refuse_final_retry`); that retry is still started (under Slurm: submitted, queued). A new
  `snakemake` run (attempt 1, after the input was fixed) always runs the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_write_text

LAST_EXIT = "last_exit.json"
"""In the output folder: the last launch's exit status, its lines and when it ended."""
ATTEMPT_ENV = "MINI_TRAINER_ATTEMPT"
"""Snakemake's attempt number for this job (1 for the first), set by the pipeline's train rule."""
FINAL_STATUSES = {2: "bad input", 3: "training diverged"}
"""Exit statuses that the same command would give again."""
REQUEUE_ENV = "MINI_TRAINER_REQUEUE"
"""1: in a Slurm job step, task 0 requeues its job after exit 75 (or 1): `requeue_reason`."""
PREEMPTED = 75
"""The exit status of a job stopped by a signal after saving its state."""
CRASH_REQUEUES = 3
"""A crashed job (exit 1) is requeued while Slurm restarted it fewer times than this."""


def record_exit(out_dir: Path, status: int, lines: list[str]) -> None:
    """The launcher, as it exits: record the outcome in `out_dir` if that folder exists (a
    refusal before anything was written creates nothing). Best effort: a full disk must not
    hide the job's own error."""
    if not out_dir.is_dir():
        return
    record = {"status": status, "lines": lines, "time": time.time()}
    with contextlib.suppress(OSError):
        atomic_write_text(out_dir / LAST_EXIT, json.dumps(record, indent=1) + "\n")


def attempt() -> int:
    """This job's attempt number (`ATTEMPT_ENV`); 1 when unset or not a number."""
    value = os.environ.get(ATTEMPT_ENV, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 1


def refuse_final_retry(out_dir: Path) -> None:
    """Raise the last outcome again (its status, its lines) when this is a pipeline's retry of
    a job that ended with a final status; do nothing otherwise."""
    number = attempt()
    if number <= 1:
        return
    try:
        record = json.loads((out_dir / LAST_EXIT).read_text())
        status, lines = int(record["status"]), [str(line) for line in record["lines"]]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if status not in FINAL_STATUSES:
        return
    raise UserError(
        *[line.removeprefix("error: ") for line in lines],
        f"{out_dir}: not retried (attempt {number}): the previous attempt ended with exit "
        f"status {status} ({FINAL_STATUSES[status]}), which the same command gives again; fix "
        "the cause and run the pipeline again",
        exit_code=status,
    )


def requeue_reason(env: Mapping[str, str], status: int, restarts: int) -> str | None:
    """Why this launcher requeues its Slurm job, or None when it does not: only when asked
    (`REQUEUE_ENV`), in a Slurm job step (the job's work, not its batch script), on task 0 (one
    request per job), after a preemption (always: the state is saved, each run gets further),
    or a crash while `restarts` (Slurm's restart count of the job) < `CRASH_REQUEUES`; never
    after 0 or a final status (2, 3)."""
    if env.get(REQUEUE_ENV) != "1" or not env.get("SLURM_JOB_ID") or "SLURM_STEP_ID" not in env:
        return None
    if env.get("SLURM_PROCID", "0") != "0":
        return None
    if status == PREEMPTED:
        return f"exit status {PREEMPTED} (stopped, state saved)"
    if status == 1 and restarts < CRASH_REQUEUES:
        return f"exit status 1 (a crash; restart {restarts + 1} of at most {CRASH_REQUEUES})"
    return None


def slurm_restarts(job_id: str) -> int:
    """How often Slurm has restarted job `job_id` (`Restarts=` of `scontrol show job`); a
    failed query counts as `CRASH_REQUEUES` (no crash requeue on a guess)."""
    try:
        result = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                                text=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return CRASH_REQUEUES
    found = re.search(r"\bRestarts=(\d+)", result.stdout)
    return int(found.group(1)) if result.returncode == 0 and found else CRASH_REQUEUES


def requeue_if_asked(status: int, env: Mapping[str, str] | None = None) -> None:
    """The launcher, as it exits with `status`: requeue this Slurm job when `requeue_reason`
    says so. On success Slurm ends the job's processes (this one too) and starts the job again
    after its requeue delay; on failure the job just ends with `status`."""
    env = os.environ if env is None else env
    reason = requeue_reason(env, status, 0)
    if reason is None:
        return
    job = env["SLURM_JOB_ID"]
    if status == 1:  # only a crash asks Slurm how often the job ran
        reason = requeue_reason(env, status, slurm_restarts(job))
        if reason is None:
            return
    print(f"mini-trainer launch: {reason}: requeueing Slurm job {job} (scontrol requeue); it "
          "resumes when Slurm starts it again", file=sys.stderr, flush=True)  # fmt: skip
    sys.stdout.flush()
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True,
                                timeout=60)  # fmt: skip
        problem = result.stderr.strip() if result.returncode != 0 else None
    except (OSError, subprocess.SubprocessError) as error:
        problem = str(error)
    if problem:
        print(f"mini-trainer launch: scontrol requeue {job} failed ({problem}); the job ends "
              f"with exit status {status}", file=sys.stderr, flush=True)  # fmt: skip
