"""The `slurm_cluster` fixture: a real one-machine Slurm cluster for the session.

tests/slurm/start.sh installs (apt-get, when missing) and starts munged, slurmctld and slurmd
with their files in a private folder; stop.sh stops them by PID. Without the prerequisites
(root, and the Slurm binaries or apt-get to install them) every test that asks for the cluster
is skipped with the reason; any other start failure fails them, with the daemons' logs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
START = HERE / "start.sh"
STOP = HERE / "stop.sh"
START_TIMEOUT_S = 300
"""apt-get install takes 15-45 s; the daemons start in about a second."""
REQUIRE_ENV = "MINI_TRAINER_REQUIRE_SLURM"
"""Set to 1 (.ci/run does) to fail instead of skipping where the cluster cannot run."""


def missing_prerequisites() -> str | None:
    """Why this machine cannot run the test cluster, or None when it can."""
    if os.name != "posix" or os.geteuid() != 0:
        return "not root (the test cluster's daemons run as root and munge)"
    if not shutil.which("runuser"):
        return "no runuser (util-linux) to start munged as the munge user"
    have = all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "munged"))
    if not have and not shutil.which("apt-get"):
        return "Slurm and munge are not installed and there is no apt-get to install them"
    return None


@dataclass
class SlurmCluster:
    """A running test cluster: its folder and how to reach it."""

    dir: Path
    start_seconds: float

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` plus SLURM_CONF for this cluster (clients and jobs read it)."""
        return {**base, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, env: dict[str, str], timeout: float = 60, check: bool = True):
        """Run a Slurm client command (sbatch, squeue, scancel, ...) against this cluster."""
        result = subprocess.run(
            list(argv), env=self.env(env), capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed: {result.stderr}{self.logs()}")
        return result

    def sbatch(self, *args: str, env: dict[str, str]) -> int:
        """Submit a job; return its id."""
        out = self.run("sbatch", "--parsable", *args, env=env).stdout.strip()
        return int(out.split(";")[0])

    def job_state(self, job_id: int, env: dict[str, str]) -> tuple[str, str]:
        """(JobState, ExitCode) from scontrol (finished jobs stay visible for MinJobAge)."""
        text = self.run("scontrol", "show", "job", str(job_id), env=env).stdout
        state = re.search(r"JobState=(\S+)", text)
        code = re.search(r"\bExitCode=(\S+)", text)
        return (state.group(1) if state else "?", code.group(1) if code else "?")

    def wait(self, job_id: int, env: dict[str, str], timeout: float) -> tuple[str, str]:
        """Wait until the job has finished; return its (JobState, ExitCode)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state, code = self.job_state(job_id, env)
            if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"):
                return state, code
            time.sleep(0.5)
        self.run("scancel", str(job_id), env=env, check=False)
        raise AssertionError(f"job {job_id} still {state} after {timeout} s{self.logs()}")

    def logs(self, lines: int = 30) -> str:
        """The tail of each daemon log, for failure messages."""
        parts = []
        for log in sorted((self.dir / "log").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"\n--- {log}\n" + "\n".join(tail))
        return "".join(parts)


def start_cluster(folder: Path) -> SlurmCluster:
    """Start a cluster in `folder` (see start.sh); fail with its output if it does not start."""
    began = time.monotonic()
    result = subprocess.run(
        ["bash", str(START), str(folder)], capture_output=True, text=True, timeout=START_TIMEOUT_S
    )
    if result.returncode != 0:
        subprocess.run(["bash", str(STOP), str(folder)], capture_output=True, timeout=60)
        raise RuntimeError(f"tests/slurm/start.sh failed ({result.returncode}):\n{result.stderr}")
    return SlurmCluster(folder, time.monotonic() - began)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real one-machine Slurm cluster, started once per session and stopped by PID."""
    reason = missing_prerequisites()
    if reason and os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"Slurm tests cannot run ({REQUIRE_ENV}=1): {reason}")
    if reason:
        pytest.skip(f"Slurm tests skipped: {reason}")
    # Not under pytest's tmp folder: that one is private to root (0700) and munged runs as munge.
    folder = Path(tempfile.mkdtemp(prefix="mini-trainer-slurm.", dir="/tmp"))
    try:
        cluster = start_cluster(folder)
    except RuntimeError as error:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.fail(str(error))
    print(f"\nSlurm test cluster up in {cluster.start_seconds:.1f} s: {folder}")
    try:
        yield cluster
    finally:
        subprocess.run(["bash", str(STOP), str(folder)], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
