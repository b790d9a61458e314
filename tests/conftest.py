"""Shared fixtures: the demo assets built once per session, one shared trained run, CLI runners.

The CLI runs in-process through click's CliRunner (the same `cli` object the entry point runs);
a few tests run it as `python -m mini_trainer` in a subprocess with this checkout first on
PYTHONPATH, so the real entry point is exercised too. Training jobs always run in real
processes (torchrun or the launcher).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: this checkout importable, no network, quiet threads."""
    env = dict(os.environ)
    # In-process runs (a world of one) set these in the test process; a child must pick its own.
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("WANDB_MODE", "disabled")
    env.update(extra)
    return env


def run_cli(
    *args: str | os.PathLike, check: bool = False, in_process: bool = True, **kwargs
) -> subprocess.CompletedProcess:
    """Run `mini-trainer ARGS...`; return the completed process with text stdout/stderr.

    In-process through click's CliRunner by default (no interpreter and torch start-up per
    call: most of a CLI test's time); `in_process=False` (or any subprocess keyword) runs
    `python -m mini_trainer` in a child process instead. An unexpected exception shows as a
    traceback on stderr and exit status 1, as it would in a child.
    """
    argv = [str(arg) for arg in args]
    if in_process and not kwargs:
        import traceback

        from click.testing import CliRunner

        from mini_trainer.cli import cli

        offline = {key: value for key, value in subprocess_env().items()
                   if key in ("HF_HUB_OFFLINE", "WANDB_MODE")}  # fmt: skip
        result = CliRunner(env=offline).invoke(cli, argv, prog_name="mini-trainer")
        stderr = result.stderr
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            stderr += "".join(traceback.format_exception(result.exception))
        completed = subprocess.CompletedProcess(argv, result.exit_code, result.stdout, stderr)
    else:
        completed = subprocess.run(
            [sys.executable, "-m", "mini_trainer", *argv],
            capture_output=True,
            text=True,
            env=kwargs.pop("env", None) or subprocess_env(),
            cwd=kwargs.pop("cwd", REPO_ROOT),
            timeout=kwargs.pop("timeout", 600),
            **kwargs,
        )
    if check and completed.returncode != 0:
        raise AssertionError(f"mini-trainer {argv} failed:\n{completed.stdout}\n{completed.stderr}")
    return completed


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """The demo assets (model/ and data/), built once through the real CLI."""
    out = tmp_path_factory.mktemp("demo")
    run_cli("demo-assets", "--out", out, check=True)
    return out


@pytest.fixture(scope="session")
def demo_model(demo_dir) -> Path:
    return demo_dir / "model"


@pytest.fixture(scope="session")
def hub_repo(demo_model, tmp_path_factory):
    """The demo model as Hub id `demo-org/tiny-llama` in an offline HF cache (tests/hf_cache.py).

    Shared: tests that change it (refs, extra commits) build their own with `build_hub_cache`.
    """
    from hf_cache import build_hub_cache

    return build_hub_cache(demo_model, tmp_path_factory.mktemp("hf_home"))


def torchrun_command(*train_flags, nproc: int = 2) -> list[str]:
    """`torchrun --nproc-per-node N -m mini_trainer.train FLAGS` as an argv list."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(nproc), "-m", "mini_trainer.train", *map(str, train_flags),
    ]  # fmt: skip


def launcher_command(*train_flags, nproc: int = 2, via: str = "train") -> list[str]:
    """`mini-trainer train --nproc-per-node N FLAGS` (the launcher) as an argv list; with
    `via="launch"`, `mini-trainer launch --nproc-per-node N -- FLAGS` (the pipeline's way in,
    which runs the same launcher)."""
    head = [sys.executable, "-m", "mini_trainer", via, "--nproc-per-node", str(nproc)]
    return [*head, *(["--"] if via == "launch" else []), *map(str, train_flags)]


def run_launcher(
    *train_flags, nproc: int = 2, timeout: int = 600, via: str = "train"
) -> subprocess.CompletedProcess:
    """Run a training job through the launcher; return it whatever its exit status."""
    return subprocess.run(
        launcher_command(*train_flags, nproc=nproc, via=via),
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=REPO_ROOT,
        timeout=timeout,
    )


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


def base_flags(demo_dir, out, task="sort_plus1", **overrides):
    flags = {
        "model-name-or-path": demo_dir / "model",
        "data-path": demo_dir / "data" / f"{task}.train.jsonl",
        "output-dir": out,
        "batch-size": 16,
        "max-tokens-per-gpu": 512,
        "learning-rate": 3e-3,
        "save-dtype": "float32",
        "seed": 7,
    }
    flags.update(overrides)
    argv = []
    for key, value in flags.items():
        if value is True:
            argv.append(f"--{key}")
        elif value is not None and value is not False:
            argv += [f"--{key}", str(value)]
    return argv


def read_metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def trained_run(demo_dir, tmp_path_factory):
    """One short 2-rank run through the launcher, shared by tests that only read it (or copy it).

    4 steps of sort_plus1 with states at steps 2 and 4 and final/ exported.
    """
    import types

    out = tmp_path_factory.mktemp("trained") / "run"
    flags = {
        "training-mode": "step",
        "max-steps": 4,
        "save-every-steps": 2,
        "save-final-checkpoint": True,
    }
    result = run_launcher(*base_flags(demo_dir, out, **flags))
    if result.returncode != 0:
        raise AssertionError(f"training failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return types.SimpleNamespace(out=out, flags=flags, steps=4, result=result)


# Headless Chromium (installed with apt-get as root where missing) and the shared full pipeline
# run, for the report page's browser test and the pipeline tests.
from browser import chromium  # noqa: E402, F401
from pipeline_runs import full_run, full_run_attempts  # noqa: E402, F401

# The session's one-machine Slurm cluster (tests/slurm/, skipped where it cannot run), and the
# reference training run its tests compare with.
from slurm.common import slurm_reference_run  # noqa: E402, F401
from slurm.harness import slurm_cluster  # noqa: E402, F401

# Under pytest-xdist (the README's test command runs `-n 3 --dist loadgroup`) every worker makes
# its own copy of a module- or session-scoped fixture. The expensive ones (a whole pipeline run,
# a Slurm cluster, a trained run) are made once: every test that uses one runs on one worker.
# Tests that share machine-wide names (network namespaces) are kept on one worker too.
SHARED_RUN_FIXTURES = (
    "full_run_attempts", "slurm_cluster", "slurm_reference_run", "validated_run", "svd_cache",
)  # fmt: skip
ONE_WORKER_FILES = {"test_two_hosts.py": "two_hosts", "test_compile.py": "compile"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        group = ONE_WORKER_FILES.get(item.path.name)
        if group is None:
            group = next((f for f in SHARED_RUN_FIXTURES if f in item.fixturenames), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
