"""Exit statuses 2 and 3 are final: a pipeline's retry of such a job ends at once, the same way.

Snakemake retries every failed job (the Slurm profile's `retries`, there for preemption and
crashes) whatever its exit status: it has no exit-code-aware retry. A job that ended with 2
(bad input: data, model, folder) or 3 (training diverged) would end the same way on each retry,
after a queue wait and a model load. So the launcher records every job's outcome in
`OUT/last_exit.json` (`record_exit`), and the pipeline's train rule passes Snakemake's attempt
number in `ATTEMPT_ENV`; a retry (attempt 2 or more) of a job whose last outcome was 2 or 3
stops before any worker starts, with that status and the lines it ended with
(`refuse_final_retry`). Preemption (75) and crashes (1) are retried as before. A new
`snakemake` run (attempt 1, after the input was fixed) always runs the job.

What remains of a refused retry: Snakemake starts it (under Slurm: submits it and it waits in the
queue), and it exits within seconds, without loading torch's workers or the model.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_write_text

LAST_EXIT = "last_exit.json"
"""In the output folder: the last launch's exit status, its lines and when it ended."""
ATTEMPT_ENV = "MINI_TRAINER_ATTEMPT"
"""Snakemake's attempt number for this job (1 for the first), set by the pipeline's train rule."""
FINAL_STATUSES = {2: "bad input", 3: "training diverged"}
"""Exit statuses that the same command would give again."""


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
