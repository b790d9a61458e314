"""Exit statuses 2 and 3 are final: a pipeline's retry of such a job ends at once with the same
status and lines, before any worker starts; 75 and 1 are retried (distributed/retry.py), under
Slurm by the job requeueing itself (tests/slurm/test_profile_slurm.py runs it on the cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import base_flags, subprocess_env

from mini_trainer.distributed.retry import (
    ATTEMPT_ENV,
    CRASH_REQUEUES,
    LAST_EXIT,
    REQUEUE_ENV,
    record_exit,
    requeue_reason,
)
from mini_trainer.errors import UserError
from mini_trainer.launch_args import TorchrunArgs


@pytest.mark.parametrize(("status", "retried"), [(2, False), (3, False), (75, True), (1, True)])
def test_a_retry_of_a_final_status_stops_before_any_worker(
    demo_dir, tmp_path, monkeypatch, status, retried
):
    from mini_trainer.train import launch

    out = tmp_path / "run"
    out.mkdir()
    record_exit(out, status, ["error: data.jsonl:7: labels: not a list"])
    monkeypatch.setenv(ATTEMPT_ENV, "2")
    # A bad flag after the check: reaching it proves the retry was let through (no worker).
    flags = [*base_flags(demo_dir, out), "--data-path", tmp_path / "absent.jsonl"]
    with pytest.raises(UserError) as caught:
        launch(TorchrunArgs(nproc_per_node=2), [str(flag) for flag in flags])
    if retried:
        assert caught.value.lines == [f"{tmp_path / 'absent.jsonl'}: --data-path: no such file"]
        return
    assert caught.value.exit_code == status
    assert caught.value.lines[0] == "data.jsonl:7: labels: not a list"
    assert caught.value.lines[1].startswith(
        f"{out}: not retried (attempt 2): the previous attempt ended with exit status {status}"
    )
    monkeypatch.setenv(ATTEMPT_ENV, "1")  # a new pipeline run (the input fixed) runs the job
    with pytest.raises(UserError, match="--data-path: no such file"):
        launch(TorchrunArgs(nproc_per_node=2), [str(flag) for flag in flags])


@pytest.mark.slow
def test_snakemake_retries_a_bad_input_job_without_running_it_again(demo_dir, tmp_path):
    """A real local Snakemake with `retries: 2`, the train rule's way of passing the attempt:
    the first attempt's workers find a bad data line (exit 2); the two retries stop at once."""
    data = tmp_path / "bad.jsonl"
    lines = (demo_dir / "data" / "sort_plus1.train.jsonl").read_text().splitlines()
    broken = json.loads(lines[1])
    broken["input_ids"][0] = 10**6  # outside the vocabulary: rank 0's data check refuses it
    data.write_text("\n".join([lines[0], json.dumps(broken), *lines[2:]]) + "\n")
    flags = " ".join(map(str, base_flags(demo_dir, "run", **{"data-path": data})))
    (tmp_path / "Snakefile").write_text(textwrap.dedent(f"""\
        rule train:
            output: directory("run/final")
            retries: 2
            resources: attempt=lambda wildcards, attempt: attempt
            shell: "{ATTEMPT_ENV}={{resources.attempt}} {sys.executable} -m mini_trainer launch "
                   "--nproc-per-node 1 -- {flags} >> attempts.log 2>&1"
        """))  # fmt: skip
    snakemake = Path(sys.executable).parent / "snakemake"
    result = subprocess.run([str(snakemake), "-c1", "--nolock"], cwd=tmp_path, text=True,
                            capture_output=True, env=subprocess_env(), timeout=600)  # fmt: skip
    assert result.returncode != 0
    log = (tmp_path / "attempts.log").read_text()
    refusals = [line for line in log.splitlines() if "not retried" in line]
    assert [line.split("(attempt ")[1][0] for line in refusals] == ["2", "3"], log
    assert log.count("mini-trainer launch (standalone)") == 3  # three attempts ...
    assert json.loads((tmp_path / "run" / LAST_EXIT).read_text())["status"] == 2
    # ... and one of them started a worker (its log lines are rank-prefixed); each told the
    # data error, the retries from the record.
    assert log.count("[rank0]") == 1, log
    assert log.count(f"error: {data}:2: input_ids") == 3, log


def test_a_slurm_job_requeues_itself_after_75_and_a_few_crashes_never_after_2_or_3():
    step = {REQUEUE_ENV: "1", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}
    assert requeue_reason(step, 75, restarts=50) == "exit status 75 (stopped, state saved)"
    assert requeue_reason(step, 1, restarts=0) == (
        f"exit status 1 (a crash; restart 1 of at most {CRASH_REQUEUES})"
    )
    assert requeue_reason(step, 1, restarts=CRASH_REQUEUES) is None
    for status in (0, 2, 3, 4):
        assert requeue_reason(step, status, restarts=0) is None, status
    # Not asked (a hand-written batch script), the batch script itself, another node's task,
    # or no Slurm job at all: nothing to requeue.
    for env in (
        {**step, REQUEUE_ENV: "0"},
        {k: v for k, v in step.items() if k != "SLURM_STEP_ID"},
        {**step, "SLURM_PROCID": "1"},
        {REQUEUE_ENV: "1"},
    ):
        assert requeue_reason(env, 75, restarts=0) is None, env
