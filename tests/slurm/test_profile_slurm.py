"""profiles/slurm: valid as written, and a training rule run through it on the test cluster.

The rule is tests/slurm/workflow/Snakefile's `train`, which runs `mini-trainer launch` like the
pipeline's train rule; the pipeline itself goes through the profile in test_pipeline_slurm.py.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
import yaml
from helpers import REPO_ROOT, subprocess_env

from slurm.common import (
    PROFILE,
    STEPS,
    assert_finished_as_the_reference,
    metrics,
    snakemake_slurm,
    train_flags,
)

WORKFLOW = REPO_ROOT / "tests" / "slurm" / "workflow" / "Snakefile"


def empty_values(value, path="") -> list[str]:
    if value in (None, "", {}, []):
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in empty_values(v, f"{path}.{k}")]
    return []


def test_profile_has_no_empty_keys_and_asks_for_the_warning_signal():
    profile = yaml.safe_load((PROFILE / "config.yaml").read_text())
    assert profile["executor"] == "slurm"
    assert empty_values(profile) == []  # `set-resources: {}` breaks Snakemake's command line
    # Nothing is submitted again (a job that ended 2 or 3 would end the same way); a preempted
    # training job requeues its own Slurm job, which sbatch --requeue allows.
    assert profile["retries"] == 0 and profile["slurm-requeue"] is True
    train = profile["set-resources"]["train"]
    assert "--signal=TERM@" in train["slurm_extra"]
    assert {"slurm_partition", "slurm_account"} <= set(profile["default-resources"])


def workflow_config(demo_dir, out) -> list[str]:
    flags = train_flags(demo_dir)
    model, data = flags[1], flags[3]
    rest = [f for f in flags[4:] if f not in ("--save-final-checkpoint", "--resume")]
    return [
        "--config", f"model={model}", f"data={data}", f"out={out}", f"flags={' '.join(rest)}",
    ]  # fmt: skip


def test_profile_dry_run(demo_dir, tmp_path):
    result = subprocess.run(
        snakemake_slurm("-s", str(WORKFLOW), "-n", *workflow_config(demo_dir, tmp_path / "run"),
                        timeout_s=120),
        capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "slurm_extra=--signal=TERM@60" in result.stdout


def submitted(output: str) -> list[str]:
    """The Slurm job ids Snakemake submitted, in its output's order."""
    return re.findall(r"has been submitted with SLURM jobid (\d+)", output)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_preempted_training_job_requeues_itself_and_a_bad_input_job_is_not_retried(
    slurm_cluster, demo_dir, slurm_reference_run, tmp_path
):
    """SIGTERM to the running Slurm job: it saves, exits 75 and requeues its own Slurm job;
    Slurm starts the same job again, it resumes from the saved state, and the final weights
    equal an uninterrupted run's; Snakemake submitted it once and retried nothing. Beside it, a
    job with a bad input (exit 2) is submitted once, fails, and is not started again."""
    out = tmp_path / "run"
    env = slurm_cluster.env(subprocess_env())
    command = snakemake_slurm("-s", str(WORKFLOW), *workflow_config(demo_dir, out), timeout_s=400)
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad_config = [*workflow_config(demo_dir, bad_dir / "run"), f"data={bad_dir / 'absent.jsonl'}"]
    bad_command = snakemake_slurm("-s", str(WORKFLOW), *bad_config, timeout_s=400)
    with (
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env, cwd=tmp_path) as snakemake,
        subprocess.Popen(bad_command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env, cwd=bad_dir) as bad,
    ):  # fmt: skip
        deadline = time.monotonic() + 240
        while len(metrics(out)) < 3:
            assert snakemake.poll() is None, snakemake.stdout.read()
            assert time.monotonic() < deadline, "no third training step within 240 s"
            time.sleep(0.2)
        jobs = slurm_cluster.run("squeue", "-h", "-t", "RUNNING", "-o", "%i %Z", env=env).stdout
        job = [line.split()[0] for line in jobs.splitlines() if line.split()[1] == str(tmp_path)]
        assert len(job) == 1, jobs
        slurm_cluster.run("scancel", "--signal=TERM", job[0], env=env)
        output, _ = snakemake.communicate(timeout=420)
        bad_output, _ = bad.communicate(timeout=420)
    run_log = (tmp_path / "run.log").read_text() if (tmp_path / "run.log").exists() else ""
    assert snakemake.returncode == 0, output[-5000:] + run_log[-3000:] + slurm_cluster.logs()
    assert "Trying to restart job" not in output
    assert submitted(output) == job, output[-5000:]
    assert "Restarts=1 " in slurm_cluster.run("scontrol", "show", "job", job[0], env=env).stdout
    stopped_at = int(run_log.split("resumed from ")[1].split("(step ")[1].split(")")[0])
    assert 3 <= stopped_at < STEPS
    assert_finished_as_the_reference(out, slurm_reference_run)

    assert bad.returncode != 0, bad_output[-5000:]
    assert len(submitted(bad_output)) == 1 and "Trying to restart job" not in bad_output
    bad_log = (bad_dir / "run.log").read_text()
    assert bad_log.count("--data-path: no such file") == 1, bad_log
    bad_job = submitted(bad_output)[0]
    assert "Restarts=0 " in slurm_cluster.run("scontrol", "show", "job", bad_job, env=env).stdout
