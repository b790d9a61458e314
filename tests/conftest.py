"""Shared fixtures: the demo assets built once per session, and a CLI runner.

The CLI runs as `python -m mini_trainer` in a subprocess with this checkout first on
PYTHONPATH, so tests exercise the real entry point whatever is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: this checkout importable, no network, quiet threads."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("WANDB_MODE", "disabled")
    env.update(extra)
    return env


def run_cli(*args: str | os.PathLike, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """Run `mini-trainer ARGS...`; return the completed process with text stdout/stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "mini_trainer", *map(str, args)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=kwargs.pop("cwd", REPO_ROOT),
        timeout=kwargs.pop("timeout", 600),
        **kwargs,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"mini-trainer {args} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """The demo assets (model/ and data/), built once through the real CLI."""
    out = tmp_path_factory.mktemp("demo")
    run_cli("demo-assets", "--out", out, check=True)
    return out


@pytest.fixture(scope="session")
def demo_model(demo_dir) -> Path:
    return demo_dir / "model"


def torchrun_command(*train_flags, nproc: int = 2) -> list[str]:
    """`torchrun --nproc-per-node N -m mini_trainer.train FLAGS` as an argv list."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(nproc), "-m", "mini_trainer.train", *map(str, train_flags),
    ]  # fmt: skip


def run_torchrun(
    *train_flags, nproc: int = 2, timeout: int = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run a training job under real torchrun (gloo on CPU); fail the test if it fails."""
    result = subprocess.run(
        torchrun_command(*train_flags, nproc=nproc),
        capture_output=True,
        text=True,
        env=subprocess_env(**(env or {})),
        cwd=REPO_ROOT,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"training failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


# The session's one-machine Slurm cluster (tests/slurm/, skipped where it cannot run), and the
# reference training run its tests compare with.
from slurm.common import slurm_reference_run  # noqa: E402, F401
from slurm.harness import slurm_cluster  # noqa: E402, F401
