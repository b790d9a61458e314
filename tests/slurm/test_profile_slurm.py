"""profiles/slurm: valid as written, and a training rule run through it on the test cluster.

The rule is tests/slurm/workflow/Snakefile's `train`, which runs `mini-trainer launch` like the
pipeline's train rule; the pipeline itself goes through the profile in test_pipeline_slurm.py.
"""

from __future__ import annotations

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
    assert profile["retries"] >= 1  # a preempted training job is submitted again
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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_preempted_training_job_is_retried_and_resumes(
    slurm_cluster, demo_dir, slurm_reference_run, tmp_path
):
    """SIGTERM to the running Slurm job: it saves and fails, the profile's retries submit it
    again, it resumes from the saved state, and the final weights equal an uninterrupted run."""
    out = tmp_path / "run"
    env = slurm_cluster.env(subprocess_env())
    command = snakemake_slurm("-s", str(WORKFLOW), *workflow_config(demo_dir, out), timeout_s=400)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path
    ) as snakemake:
        deadline = time.monotonic() + 240
        while len(metrics(out)) < 3:
            assert snakemake.poll() is None, snakemake.stdout.read()
            assert time.monotonic() < deadline, "no third training step within 240 s"
            time.sleep(0.2)
        jobs = slurm_cluster.run("squeue", "-h", "-o", "%i", env=env).stdout.split()
        assert len(jobs) == 1, jobs
        slurm_cluster.run("scancel", "--signal=TERM", jobs[0], env=env)
        output, _ = snakemake.communicate(timeout=420)
    assert snakemake.returncode == 0, output[-5000:] + slurm_cluster.logs()
    assert "Trying to restart job" in output
    log = (tmp_path / "run.log").read_text()  # Snakemake removed the first attempt's log
    stopped_at = int(log.split("resumed from ")[1].split("(step ")[1].split(")")[0])
    assert 3 <= stopped_at < STEPS
    assert_finished_as_the_reference(out, slurm_reference_run)
