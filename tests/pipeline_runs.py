"""Pipeline runs shared by several test modules, made at most once per test session.

`full_run`: the whole demo DAG (three methods, a chat task, two stages, evaluation, manifest,
report) in a temporary copy of the workflow. Its first attempt has its first training job
SIGKILLed (the launcher and its workers) once that job saved a state; the same command then
finishes the experiment, resuming the killed job. tests/test_pipeline.py checks what it wrote;
tests/test_report.py opens its report page in a browser. Session scope, so the suite runs the
pipeline once for all of them.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from helpers import kill_tree


def run_killing_the_first_training(workdir: Path, command: list[str], env: dict) -> Path:
    """Run `command` (a snakemake run) until a training job has saved a state, SIGKILL that
    job's launcher and workers, wait for Snakemake to give up; return the killed run folder."""
    log = (workdir / "first.log").open("w")
    first = subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    killed = None
    deadline = time.monotonic() + 900
    try:
        while killed is None and time.monotonic() < deadline and first.poll() is None:
            states = sorted(workdir.glob("results/train/*/*/stage*/*/state/step_*"))
            if states:
                run = states[0].parent.parent
                for job in psutil.Process(first.pid).children():
                    with contextlib.suppress(psutil.NoSuchProcess):
                        if "mini_trainer launch" in " ".join(job.cmdline()) and str(
                            run.relative_to(workdir)
                        ) in " ".join(job.cmdline()):
                            kill_tree(job)
                            killed = run
            time.sleep(0.05)
        first.wait(timeout=600)
    finally:
        if first.poll() is None:
            kill_tree(psutil.Process(first.pid))
        log.close()
    assert killed is not None, (workdir / "first.log").read_text()[-3000:]
    assert first.returncode != 0
    assert not (killed / "final").exists()
    return killed


@pytest.fixture(scope="session")
def full_run_attempts(tmp_path_factory) -> dict:
    """{"workdir": the finished experiment, "killed": the run folder killed in attempt one}."""
    # The workflow helpers live with the pipeline tests (pytest imports that module by name).
    from helpers import subprocess_env
    from test_pipeline import (
        _full_config,
        _write_chat_task,
        check,
        make_workdir,
        snakemake,
        snakemake_command,
    )

    workdir = make_workdir(tmp_path_factory.mktemp("full"), _full_config())
    _write_chat_task(workdir)
    command = [*snakemake_command(), "--cores", "2"]
    killed = run_killing_the_first_training(workdir, command, subprocess_env())
    check(snakemake(workdir, "--cores", "2"))
    return {"workdir": workdir, "killed": killed}


@pytest.fixture(scope="session")
def full_run(full_run_attempts) -> Path:
    return full_run_attempts["workdir"]
