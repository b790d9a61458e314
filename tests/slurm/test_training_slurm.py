"""Training on a real Slurm cluster: multi-node rendezvous and preemption (sbatch, no Snakemake).

Several slurmd on one host are not supported by Debian's Slurm, so "two nodes" are two tasks on
the one node: each task runs its own torchrun with one process, node rank from SLURM_PROCID,
rendezvous on the first host, exactly as on N real nodes with one task each.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from helpers import subprocess_env

from mini_trainer.distributed.slurm import first_host
from slurm.common import STEPS, assert_finished_as_the_reference, metrics, train_flags

pytestmark = pytest.mark.slow

# What Snakemake's Slurm job step (snakemake-executor-plugin-slurm-jobstep 0.6) does before it
# runs a rule's command: drop every SLURM_* variable but these, SLURM_CONF and SLURM_NTASKS too.
LIKE_SNAKEMAKE_JOBSTEP = """
for v in $(compgen -e | grep '^SLURM_'); do
  case $v in
    SLURM_JOB_ID|SLURM_JOBID|SLURM_CLUSTER_NAME|SLURM_SUBMIT_DIR|SLURM_SUBMIT_HOST) ;;
    *) unset "$v" ;;
  esac
done
"""


def job_script(folder: Path, nproc: int, flags: list[str], like_snakemake: bool = False) -> Path:
    """A batch script that runs `mini-trainer launch` (the training rule's command)."""
    script = folder / "job.sh"
    args = " ".join(f"'{a}'" for a in flags)
    script.write_text(
        "#!/bin/bash\n"
        + (LIKE_SNAKEMAKE_JOBSTEP if like_snakemake else "")
        + f"exec '{sys.executable}' -m mini_trainer launch --nproc-per-node {nproc} -- {args}\n"
    )
    return script


def test_first_host_matches_scontrol(slurm_cluster):
    env = subprocess_env()
    for nodelist in [
        "vm",
        "gpu[010,003]",
        "gpu[003-005,010],cpu1",
        "rack[1-2]-n[07-09]",
        "a-1,b[2-3]",
    ]:
        hosts = slurm_cluster.run("scontrol", "show", "hostnames", nodelist, env=env).stdout
        assert first_host(nodelist) == hosts.split()[0], nodelist


def test_two_tasks_rendezvous_like_two_nodes(
    slurm_cluster, demo_dir, slurm_reference_run, tmp_path
):
    """2 Slurm tasks x 1 process = one 2-process job: step 1's loss and grad norm match.

    The batch script drops the SLURM_* variables as Snakemake's job step does for a rule with
    `mpi="srun"`, so the launcher must find the task count itself.
    """
    out = tmp_path / "run"
    script = job_script(tmp_path, 1, train_flags(demo_dir, out, steps=1), like_snakemake=True)
    log = tmp_path / "job.log"
    env = subprocess_env()
    job = slurm_cluster.sbatch(
        "--ntasks", "2", "--cpus-per-task", "1", "-o", str(log), "-D", str(tmp_path), str(script),
        env=env,
    )  # fmt: skip
    state, code = slurm_cluster.wait(job, env, timeout=180)
    text = log.read_text(errors="replace")
    assert (state, code) == ("COMPLETED", "0:0"), text[-3000:]
    # One srun fan-out, then one torchrun per task, node ranks 0 and 1, one store host.
    assert (
        text.count("mini-trainer launch (srun): srun --kill-on-bad-exit=1 --nodes=1 --ntasks=2")
        == 1
    )
    tasks = [line for line in text.splitlines() if "mini-trainer launch (slurm-task)" in line]
    assert len(tasks) == 2, text[-3000:]
    assert sorted("--node-rank 0" in t for t in tasks) == [False, True]
    assert all("--nnodes 2 --nproc-per-node 1" in t for t in tasks)
    assert sum("is_host=true" in t for t in tasks) == 1
    assert "2 ranks on cpu" in text
    got, want = metrics(out)[0], metrics(slurm_reference_run)[0]
    assert got["step"] == want["step"] == 1
    assert got["num_loss_tokens"] == want["num_loss_tokens"]
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6, abs=0)
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-6, abs=0)


def test_sigterm_saves_state_and_resubmission_resumes(
    slurm_cluster, demo_dir, slurm_reference_run, tmp_path
):
    """scancel --signal=TERM mid-run: state saved; the same job again resumes to equal weights."""
    out = tmp_path / "run"
    script = job_script(tmp_path, 2, train_flags(demo_dir, out))
    env = subprocess_env()

    def submit(log: Path) -> int:
        return slurm_cluster.sbatch(
            "--ntasks", "1", "--cpus-per-task", "2", "-o", str(log), "-D", str(tmp_path),
            str(script), env=env,
        )  # fmt: skip

    first_log = tmp_path / "first.log"
    job = submit(first_log)
    deadline = time.monotonic() + 180
    while len(metrics(out)) < 3:
        state, _ = slurm_cluster.job_state(job, env)
        assert state in ("PENDING", "RUNNING"), first_log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "no third training step within 180 s"
        time.sleep(0.2)
    slurm_cluster.run("scancel", "--signal=TERM", str(job), env=env)
    state, _ = slurm_cluster.wait(job, env, timeout=120)
    text = first_log.read_text(errors="replace")
    # torchrun exits 1 whatever its workers returned; the workers said 75 and saved.
    assert state == "FAILED", text[-3000:]
    assert "stopped by SIGTERM" in text and "exit status 75" in text, text[-3000:]
    stopped_at = len(metrics(out))
    assert 3 <= stopped_at < STEPS
    assert (out / "state" / f"step_{stopped_at}" / "trainer_state.json").exists()
    assert not (out / "final").exists()

    second_log = tmp_path / "second.log"
    state, code = slurm_cluster.wait(submit(second_log), env, timeout=240)
    text = second_log.read_text(errors="replace")
    assert (state, code) == ("COMPLETED", "0:0"), text[-3000:]
    assert f"resumed from {out / 'state' / f'step_{stopped_at}'}" in text
    assert_finished_as_the_reference(out, slurm_reference_run)
