"""Shared fixtures: the demo assets built once per session, one shared trained run, the shared
pipeline and Slurm runs, and how xdist keeps each expensive one on one worker.

Helpers (CLI and training runners, flags, metrics) are in tests/helpers.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from mini_trainer.distributed.launcher import REPRODUCIBLE_MKL

# MKL reads MKL_CBWR once, when torch loads it. The launcher sets it for its workers, and an
# in-process launcher (run_cli) would set it in this process too, after this process's MKL
# started: children started later would then compute otherwise than this process's in-process
# jobs. Set before any test imports torch, every job of the suite computes alike.
os.environ.setdefault(*REPRODUCIBLE_MKL)

import pytest  # noqa: E402
from helpers import DESELECTED, WHOLE_SUITE_COUNT, base_flags, run_cli, run_launcher  # noqa: E402


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


@pytest.fixture(scope="module")
def world_of_one():
    """A gloo process group of one rank in this test process (FSDP2 needs one)."""
    import socket

    import torch
    import torch.distributed as dist

    from mini_trainer.distributed.runtime import Runtime

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield Runtime(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    dist.destroy_process_group()


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
    "full_run_attempts", "slurm_cluster", "slurm_reference_run", "trained_run", "svd_cache",
    "hub_run",
)  # fmt: skip
"""First match names the group: `validated_run` needs `trained_run`, so its tests and every other
reader of `trained_run` share one worker and one copy of it."""
ONE_WORKER_FILES = {"test_two_hosts.py": "two_hosts", "test_compile.py": "compile"}


# tryfirst: xdist's own hook turns the markers into the `@group` suffix it schedules by; a
# marker added after it is ignored (every worker then made its own Slurm cluster and pipeline run).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = ONE_WORKER_FILES.get(item.path.name)
        if group is None:
            group = next((f for f in SHARED_RUN_FIXTURES if f in item.fixturenames), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


# How many tests the whole suite has, for test_docs.py's check of the README's count: when this
# session collected every test (run with no paths, or `tests`), the count is its own collection
# plus what -m/-k deselected; otherwise (a file or a node id) None, and the check collects the
# suite in a child process.


def pytest_deselected(items):
    config = items[0].config if items else None
    if config is not None:
        config.stash[DESELECTED] = config.stash.get(DESELECTED, 0) + len(items)


def pytest_collection_finish(session):
    tests = Path(__file__).parent
    whole = bool(session.config.args) and all(
        Path(arg).resolve() in (tests, tests.parent) for arg in session.config.args
    )
    counted = len(session.items) + session.config.stash.get(DESELECTED, 0)
    session.config.stash[WHOLE_SUITE_COUNT] = counted if whole else None
