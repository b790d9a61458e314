"""`plan_launch` and its helpers: how `mini-trainer launch` reads Slurm's environment (pure)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO_ROOT, subprocess_env

from mini_trainer.distributed.slurm import (
    PORT_BASE,
    PORT_SPAN,
    first_host,
    parse_scontrol_job,
    plan_launch,
    rendezvous_port,
    with_allocation,
)
from mini_trainer.errors import UserError

FLAGS = ["--model-name-or-path", "m", "--data-path", "d.jsonl", "--output-dir", "out"]
PY = "/env/bin/python"


def after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_outside_slurm_runs_standalone():
    plan = plan_launch({"HOME": "/root"}, 4, FLAGS, python=PY)
    assert plan.mode == "standalone"
    assert plan.argv == [
        PY, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", "4", "-m", "mini_trainer.train", *FLAGS,
    ]  # fmt: skip


def test_batch_script_fans_out_with_srun_and_passes_cpus_per_task():
    env = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4", "SLURM_CPUS_PER_TASK": "16"}
    plan = plan_launch(env, 8, FLAGS, python=PY, rdzv_port=29400)
    assert plan.mode == "srun"
    assert plan.torchrun is None
    assert plan.argv == [
        "srun", "--kill-on-bad-exit=1", "--ntasks=4", "--cpus-per-task=16",
        PY, "-m", "mini_trainer", "launch", "--nproc-per-node", "8", "--rdzv-port", "29400",
        "--", *FLAGS,
    ]  # fmt: skip


def test_batch_script_without_task_variables_lets_srun_use_the_allocation():
    plan = plan_launch({"SLURM_JOB_ID": "5"}, 2, FLAGS, python=PY)
    assert plan.mode == "srun"
    assert plan.argv[:3] == ["srun", "--kill-on-bad-exit=1", PY]


SCONTROL = (
    "JobId=17 JobName=x UserId=root(0) GroupId=root(0) JobState=RUNNING Reason=None "
    "NumNodes=4 NumCPUs=256 NumTasks=4 CPUs/Task=64 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=256,mem=100G,node=4,billing=256,gres/gpu=32 Socks/Node=* MinCPUsNode=64"
)


def test_parse_scontrol_job_gives_the_batch_variables():
    assert parse_scontrol_job(SCONTROL) == {
        "SLURM_NNODES": "4", "SLURM_NTASKS": "4", "SLURM_CPUS_PER_TASK": "64",
    }  # fmt: skip
    assert parse_scontrol_job("JobId=3 NumNodes=1-2 NumTasks=2 CPUs/Task=N/A") == {
        "SLURM_NTASKS": "2"
    }


def test_snakemake_stripped_batch_env_completed_from_scontrol_fans_out_per_task():
    # Snakemake's job step drops SLURM_* except the job id; scontrol fills them back in.
    env = {"SLURM_JOB_ID": "17", **parse_scontrol_job(SCONTROL)}
    plan = plan_launch(env, 8, FLAGS, python=PY)
    assert plan.argv[:5] == [
        "srun",
        "--kill-on-bad-exit=1",
        "--nodes=4",
        "--ntasks=4",
        "--cpus-per-task=64",
    ]


def test_with_allocation_leaves_complete_or_non_batch_environments_alone():
    for env in ({}, {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0"},
                {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2"}):  # fmt: skip
        assert with_allocation(env) == env  # no scontrol call: there is none here


def task_env(procid: int, **extra: str) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid),
        "SLURM_STEP_NUM_TASKS": "3", "SLURM_NTASKS": "3",
        "SLURM_JOB_NODELIST": "gpu[007-009]", "SLURM_STEP_NODELIST": "gpu[007-009]",
        **extra,
    }  # fmt: skip


def test_each_task_of_a_step_is_one_node_of_the_rendezvous():
    plans = [plan_launch(task_env(i), 8, FLAGS, python=PY) for i in range(3)]
    port = rendezvous_port(4242, 0)
    for rank, plan in enumerate(plans):
        argv = plan.argv
        assert plan.mode == "slurm-task"
        assert after(argv, "--nnodes") == "3"
        assert after(argv, "--nproc-per-node") == "8"
        assert after(argv, "--node-rank") == str(rank)
        assert after(argv, "--rdzv-backend") == "c10d"
        assert after(argv, "--rdzv-endpoint") == f"gpu007:{port}"
        assert after(argv, "--rdzv-id") == "slurm-4242.0"
        assert after(argv, "--rdzv-conf") == f"is_host={'true' if rank == 0 else 'false'}"
        assert "--standalone" not in argv
        assert argv[-len(FLAGS) - 2 :] == ["-m", "mini_trainer.train", *FLAGS]


def test_step_node_list_wins_over_the_job_one_and_port_can_be_forced():
    env = task_env(1, SLURM_STEP_NODELIST="gpu[008-009]", MINI_TRAINER_RDZV_PORT="31000")
    plan = plan_launch(env, 1, FLAGS, python=PY)
    assert after(plan.argv, "--rdzv-endpoint") == "gpu008:31000"
    plan = plan_launch(env, 1, FLAGS, python=PY, rdzv_port=29500)
    assert after(plan.argv, "--rdzv-endpoint") == "gpu008:29500"


def test_a_single_task_step_runs_standalone():
    # The Snakemake job step's own `srun -n1` (a one-node training job without mpi).
    env = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
           "SLURM_STEP_NUM_TASKS": "1", "SLURM_JOB_NODELIST": "n1"}  # fmt: skip
    plan = plan_launch(env, 2, FLAGS, python=PY)
    assert plan.mode == "standalone"
    assert "--standalone" in plan.argv


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [
        ("node7", "node7"),
        ("gpu[003-005,010],cpu1", "gpu003"),
        ("gpu[010,003]", "gpu010"),
        ("rack[1-2]-n[07-09]", "rack1-n07"),
        ("a-1,b[2-3]", "a-1"),
        (" x[0001-0004] ", "x0001"),
    ],
)
def test_first_host(nodelist, host):
    assert first_host(nodelist) == host


@pytest.mark.parametrize("nodelist", ["", "gpu[1-2", "gpu]1["])
def test_first_host_refuses_what_it_cannot_read(nodelist):
    with pytest.raises(UserError, match="SLURM_JOB_NODELIST"):
        first_host(nodelist)


def test_rendezvous_port_range_and_spread():
    ports = {rendezvous_port(job, step) for job in range(1000, 1200) for step in range(3)}
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)
    assert len(ports) == 600  # distinct for nearby jobs and steps
    assert rendezvous_port(5, 0) == rendezvous_port(5, 0)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLURM_JOB_ID": "x1"}, "SLURM_JOB_ID: not an integer"),
        ({**task_env(0), "SLURM_PROCID": ""}, "SLURM_PROCID: not set"),
    ],
)
def test_bad_slurm_variables_are_user_errors(env, message):
    with pytest.raises(UserError, match=message):
        plan_launch(env, 1, FLAGS, python=PY)


def test_nproc_must_be_positive():
    with pytest.raises(UserError, match="--nproc-per-node"):
        plan_launch({}, 0, FLAGS, python=PY)


def launch_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in subprocess_env().items() if not k.startswith("SLURM_")}
    return subprocess.run(
        [sys.executable, "-m", "mini_trainer", "launch", *args],
        capture_output=True, text=True, env={**clean, **env}, cwd=REPO_ROOT, timeout=120,
    )  # fmt: skip


def test_cli_dry_run_prints_the_plan():
    """(With the pipeline's MINI_TRAINER_DROP_STATES=1, the job drops its states after final/.)"""
    result = launch_cli("--nproc-per-node", "2", "--dry-run", "--", *FLAGS,
                        "--save-final-checkpoint",
                        env={**task_env(2), "MINI_TRAINER_DROP_STATES": "1"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "--node-rank 2" in result.stdout
    assert "-m mini_trainer.train --model-name-or-path m" in result.stdout
    assert result.stdout.count("--drop-states-after-final") == 1


def test_cli_checks_training_flags_before_starting_anything():
    result = launch_cli("--nproc-per-node", "2", "--dry-run", "--", "--batch-size", "0",
                        *FLAGS, env={})  # fmt: skip
    assert result.returncode == 2
    assert "--batch-size: must be at least 1" in result.stderr
    assert "torch.distributed.run" not in result.stdout
