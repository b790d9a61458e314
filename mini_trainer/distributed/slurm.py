"""Start the training job's torchrun from Slurm's environment: one command for 1 or N nodes.

`mini-trainer launch --nproc-per-node P -- TRAIN_FLAGS` runs `torchrun ... -m mini_trainer.train
TRAIN_FLAGS` in one of three ways, decided by `plan_launch` from the SLURM_* variables alone
(a pure function, so every case is unit-tested with a plain dict):

- no Slurm job (`SLURM_JOB_ID` unset): `torchrun --standalone`, P processes on this machine.
- in a job but not in a job step (the batch script, or a Snakemake job with `mpi="srun"`):
  re-run this same command under `srun` with the job's `--nodes`, `--ntasks` and
  `--cpus-per-task` (one task per node on a real cluster). Snakemake's job step removes those
  variables, so `with_allocation` asks `scontrol show job` for them first. Training always
  runs in a job step, so Slurm's signals (`scancel --signal=TERM`, `--signal=TERM@<seconds>`
  before the time limit) reach it.
- in a job step (`SLURM_STEP_ID` set), one task of N: torchrun with `--nnodes N`, `--node-rank
  $SLURM_PROCID` and a c10d rendezvous on the first host of the step's node list, at a port
  derived from the job and step ids; task 0 hosts the rendezvous store. With N == 1, standalone.

torchrun's c10d rendezvous hands out global ranks itself (it ignores `--node-rank`, and says so
once), which is why the store's host is chosen explicitly with `is_host` instead of being
guessed from host names: with several tasks on one host (the one-machine test cluster) every
task would match the first host's name.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from mini_trainer.distributed.launcher import torchrun_command
from mini_trainer.errors import UserError
from mini_trainer.launch_args import TorchrunArgs

PORT_BASE = 15000
PORT_SPAN = 17000
"""Rendezvous ports are PORT_BASE + (hash of job and step) % PORT_SPAN: 15000-31999, below
Linux's ephemeral range (32768-60999), so they do not collide with outgoing connections."""

PORT_ENV = "MINI_TRAINER_RDZV_PORT"
"""Set it to force the rendezvous port (for example when a firewall allows only one)."""


@dataclass(frozen=True)
class LaunchPlan:
    """What `launch` will execute, and why."""

    mode: Literal["standalone", "srun", "slurm-task"]
    """torchrun on this machine; srun fanning out one task per node; or one node of N."""
    argv: list[str]
    """The command to execute in place of this process."""
    torchrun: TorchrunArgs | None
    """torchrun's arguments (None for "srun", whose tasks plan again)."""


def first_host(nodelist: str) -> str:
    """The first host name of a Slurm host list, like `scontrol show hostnames | head -1`.

    `gpu[003-005,010],cpu1` -> `gpu003`; `rack[1-2]-n[07-09]` -> `rack1-n07`; `node7` -> `node7`.
    Each bracket is replaced by the first item of its first range, padding kept.
    """
    text = nodelist.strip()
    if not text:
        raise UserError("SLURM_JOB_NODELIST: empty host list")
    depth = 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            text = text[:i]
            break
    host = re.sub(r"\[([^\]\-,]+)[^\]]*\]", r"\1", text)
    if any(c in host for c in "[],") or not host:
        raise UserError(f"SLURM_JOB_NODELIST: cannot read host list {nodelist!r}")
    return host


def rendezvous_port(job_id: int, step_id: int) -> int:
    """A port shared by every task of one job step, different for other jobs and steps.

    Two jobs (or two steps of one job) on the same first host then rarely pick the same port;
    set MINI_TRAINER_RDZV_PORT where they must never collide.
    """
    return PORT_BASE + (job_id * 7919 + step_id) % PORT_SPAN


SCONTROL_FIELDS = {
    "NumNodes": "SLURM_NNODES",
    "NumTasks": "SLURM_NTASKS",
    "CPUs/Task": "SLURM_CPUS_PER_TASK",
}
"""`scontrol show job` fields that stand in for the batch job's SLURM_* variables."""


def parse_scontrol_job(text: str) -> dict[str, str]:
    """The allocation's node, task and CPU-per-task counts from `scontrol show job -o ID`,
    as the SLURM_* variables a batch script would have."""
    found = dict(re.findall(r"(?:^|\s)([A-Za-z/]+)=(\S*)", text))
    return {
        var: found[key]
        for key, var in SCONTROL_FIELDS.items()
        if re.fullmatch(r"[0-9]+", found.get(key, ""))
    }


def with_allocation(env: Mapping[str, str]) -> dict[str, str]:
    """`env`, completed from `scontrol show job` when a batch job lost its SLURM_* variables.

    Snakemake's Slurm job step keeps only SLURM_JOB_ID (and a few names) when it runs a rule's
    command, so the job's task count must be asked of Slurm; without it srun would start one
    task per node, wrong for several tasks per node and silent about it.
    """
    out = dict(env)
    if not env.get("SLURM_JOB_ID") or "SLURM_STEP_ID" in env or env.get("SLURM_NTASKS"):
        return out
    result = subprocess.run(
        ["scontrol", "show", "job", "-o", env["SLURM_JOB_ID"]],
        capture_output=True,
        text=True,
        env=dict(env),
        timeout=60,
    )
    if result.returncode != 0:
        raise UserError(f"scontrol show job {env['SLURM_JOB_ID']}: {result.stderr.strip()}")
    for name, value in parse_scontrol_job(result.stdout).items():
        out.setdefault(name, value)
    return out


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None or value == "":
        if default is None:
            raise UserError(f"{name}: not set by Slurm (is this a Slurm job step?)")
        return default
    try:
        return int(value.split("(")[0].split(",")[0])
    except ValueError:
        raise UserError(f"{name}: not an integer: {value!r}") from None


def plan_launch(
    env: Mapping[str, str],
    nproc_per_node: int,
    train_flags: Sequence[str],
    *,
    python: str = sys.executable,
    rdzv_port: int | None = None,
) -> LaunchPlan:
    """Decide how to start the training job here; see the module docstring for the three cases.

    `env` is the process environment (only SLURM_* and MINI_TRAINER_RDZV_PORT are read),
    `train_flags` the training job's flags, `python` the interpreter that runs torchrun.
    """
    if nproc_per_node < 1:
        raise UserError(f"--nproc-per-node: must be at least 1, got {nproc_per_node}")
    train = list(train_flags)
    if not env.get("SLURM_JOB_ID"):
        torchrun = TorchrunArgs(nproc_per_node=nproc_per_node)
        return LaunchPlan("standalone", torchrun_command(torchrun, train, python), torchrun)

    job_id = _int(env, "SLURM_JOB_ID")
    if "SLURM_STEP_ID" not in env:
        return LaunchPlan(
            "srun", _srun_argv(env, python, nproc_per_node, rdzv_port, train_flags), None
        )

    step_id = _int(env, "SLURM_STEP_ID")
    tasks = _int(env, "SLURM_STEP_NUM_TASKS", _int(env, "SLURM_NTASKS", 1))
    if tasks == 1:
        torchrun = TorchrunArgs(nproc_per_node=nproc_per_node)
        return LaunchPlan("standalone", torchrun_command(torchrun, train, python), torchrun)
    proc_id = _int(env, "SLURM_PROCID")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    port = rdzv_port or _int(env, PORT_ENV, rendezvous_port(job_id, step_id))
    torchrun = TorchrunArgs(
        nproc_per_node=nproc_per_node,
        nnodes=tasks,
        node_rank=proc_id,
        rdzv_id=f"slurm-{job_id}.{step_id}",
        rdzv_endpoint=f"{first_host(nodelist)}:{port}",
        rdzv_conf=f"is_host={'true' if proc_id == 0 else 'false'}",
    )
    return LaunchPlan("slurm-task", torchrun_command(torchrun, train, python), torchrun)


def _srun_argv(
    env: Mapping[str, str],
    python: str,
    nproc_per_node: int,
    rdzv_port: int | None,
    train_flags: Sequence[str],
) -> list[str]:
    """`srun` over the whole allocation, running this launcher again in each task.

    The job's nodes, tasks and CPUs per task are passed on explicitly: since Slurm 22.05 srun no
    longer inherits --cpus-per-task from the batch job, and under Snakemake the variables are
    gone (see `with_allocation`). --kill-on-bad-exit stops the other tasks (waiting at the
    rendezvous) when one fails.
    """
    argv = ["srun", "--kill-on-bad-exit=1"]
    for name, flag in (
        ("SLURM_NNODES", "--nodes"),
        ("SLURM_NTASKS", "--ntasks"),
        ("SLURM_CPUS_PER_TASK", "--cpus-per-task"),
    ):
        if env.get(name):
            argv.append(f"{flag}={_int(env, name)}")
    argv += [python, "-m", "mini_trainer", "launch", "--nproc-per-node", str(nproc_per_node)]
    if rdzv_port:
        argv += ["--rdzv-port", str(rdzv_port)]
    return [*argv, "--", *train_flags]
