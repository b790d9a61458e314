"""Shared by the Slurm tests: the demo training flags and the uninterrupted reference run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

STEPS = 12


def train_flags(demo_dir: Path, out: Path | None = None, steps: int = STEPS) -> list[str]:
    """A short, resumable demo training job (with `--output-dir out` when given)."""
    flags = [
        "--model-name-or-path", str(demo_dir / "model"),
        "--data-path", str(demo_dir / "data" / "sort.train.jsonl"),
        "--batch-size", "16", "--max-tokens-per-gpu", "1024", "--learning-rate", "0.01",
        "--training-mode", "step", "--max-steps", str(steps), "--save-dtype", "float32",
        "--save-final-checkpoint", "--resume",
    ]  # fmt: skip
    return flags + (["--output-dir", str(out)] if out is not None else [])


def metrics(out: Path) -> list[dict]:
    """The complete lines of OUT/metrics.jsonl (a line being written is left out)."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def assert_finished_as_the_reference(out: Path, reference: Path) -> None:
    """Every step logged once, and final/ bit-identical to the uninterrupted reference run's."""
    assert [m["step"] for m in metrics(out)] == list(range(1, STEPS + 1))
    got = load_file(out / "final" / "model.safetensors")
    want = load_file(reference / "final" / "model.safetensors")
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


@pytest.fixture(scope="session")
def slurm_reference_run(demo_dir, tmp_path_factory) -> Path:
    """An uninterrupted 2-process single-node run (plain torchrun), the one to match."""
    from helpers import run_torchrun

    out = tmp_path_factory.mktemp("reference") / "run"
    run_torchrun(*train_flags(demo_dir, out), nproc=2, timeout=300)
    return out


PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "slurm"

# The one-machine test cluster instead of a real one: its partition, no accounts, no slurmdbd
# (so squeue, not sacct, for job status; MinJobAge=600 keeps finished jobs visible), small
# resources, and a first status check after 2 s instead of 40. Up to 6 jobs are submitted at
# once, so that Slurm starts a queued job as soon as a CPU frees, without waiting for
# Snakemake's next status check. On the command line these replace the profile's whole
# default-resources and set-resources lists.
TEST_OVERRIDES = [
    "--default-resources", "slurm_partition=debug", "runtime=10", "mem_mb=1000",
    "--set-resources", "train:slurm_partition=debug", "train:runtime=10", "train:mem_mb=2000",
    "train:slurm_extra='--signal=TERM@60'",
    "--slurm-no-account",
    "--slurm-status-command", "squeue",
    "--slurm-init-seconds-before-status-checks", "2",
    "--latency-wait", "5",
    "--jobs", "6",
]  # fmt: skip


def snakemake_slurm(*args: str, timeout_s: int) -> list[str]:
    """`timeout T snakemake --profile profiles/slurm ARGS TEST_OVERRIDES` as an argv list."""
    return [
        "timeout", "--kill-after=30", str(timeout_s),
        sys.executable, "-m", "snakemake", "--profile", str(PROFILE), *args, *TEST_OVERRIDES,
    ]  # fmt: skip
