"""`--compile`: compiled decoder layers compute what eager ones do, resume exactly, recompile
rarely, and a machine that cannot compile stops the run with one line (never a silent eager run).

Compiling on the shared 2-core machine takes minutes: the runs here are 2-4 steps of the demo
model, and later compiled runs reuse inductor's on-disk cache of the first one's kernels.
"""

from __future__ import annotations

import re
import sys

import pytest
from helpers import (
    base_flags,
    kill_when_saved,
    read_metrics,
    run_torchrun,
    train_in_process,
)
from safetensors.torch import load_file


def test_a_missing_cxx_compiler_is_named(monkeypatch):
    from torch._inductor import config

    from mini_trainer.training.compile import compiler_missing

    assert compiler_missing(is_cuda=False) is None  # g++ here
    monkeypatch.setattr(config.cpp, "cxx", (None, "/nonexistent/c++"))
    reason = compiler_missing(is_cuda=False)
    assert reason and "no usable C++ compiler" in reason and "/nonexistent/c++" in reason
    assert compiler_missing(is_cuda=True) is None  # CUDA kernels need no C++ compiler


@pytest.mark.slow
def test_compile_without_a_compiler_stops_with_one_line(demo_dir, tmp_path, monkeypatch):
    """A whole one-rank job in this process, inductor's compiler set as `CXX=/nonexistent/c++`
    sets it (test_a_missing_cxx_compiler_is_named)."""
    from torch._inductor import config

    monkeypatch.setattr(config.cpp, "cxx", (None, "/nonexistent/c++"))
    out = tmp_path / "run"
    flags = base_flags(demo_dir, out, **{"training-mode": "step", "max-steps": 1, "compile": True})
    result = train_in_process(*flags)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "--compile" in line]
    assert len(errors) == 1 and "cannot build kernels" in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not (out / "metrics.jsonl").exists() or not read_metrics(out)  # no eager step ran


def compilations(stderr: str) -> int:
    """The last count the compiled layers logged (0 when nothing was compiled)."""
    counts = re.findall(r"compile: (\d+) compilations, (\d+) graphs so far", stderr)
    return int(counts[-1][0]) if counts else 0


# One compiled run (2 ranks) and its eager twin (one rank), shared by the tests below: FSDP2,
# OSFT's factorized layers, activation checkpointing, the chunked loss and the per-sample packed
# attention, states every 2 steps.
FLAGS = {"training-mode": "step", "max-steps": 6, "save-every-steps": 2,
         "save-final-checkpoint": True, "osft": True, "osft-unfreeze-rank-ratio": 0.5,
         "activation-checkpointing": True}  # fmt: skip


@pytest.fixture(scope="module")
def compiled_run(demo_dir, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("compile")
    # The eager twin on one rank, in this process: the same global batches, and a step does
    # not depend on the split over ranks (test_train.py's test_step_is_exact_whatever_the_split).
    assert train_in_process(*base_flags(demo_dir, root / "eager", **FLAGS)).returncode == 0
    compiled = run_torchrun(*base_flags(demo_dir, root / "compiled", **FLAGS, compile=True))
    return {"root": root, "stderr": compiled.stderr}


@pytest.mark.slow
@pytest.mark.timeout(2400)  # a cold compile alone takes minutes on the shared 2 cores
def test_compiled_steps_equal_eager_with_osft_and_checkpointing(compiled_run):
    """Step 1's loss and grad norm (and step 2's loss) equal eager to 1e-5."""
    assert "compile: 4 decoder layers" in compiled_run["stderr"]
    assert compilations(compiled_run["stderr"]) > 0  # it did compile, and said so
    eager = read_metrics(compiled_run["root"] / "eager")
    fast = read_metrics(compiled_run["root"] / "compiled")
    assert fast[0]["num_loss_tokens"] == eager[0]["num_loss_tokens"]
    assert fast[0]["loss"] == pytest.approx(eager[0]["loss"], rel=1e-5)
    assert fast[0]["grad_norm"] == pytest.approx(eager[0]["grad_norm"], rel=1e-5)
    assert fast[1]["loss"] == pytest.approx(eager[1]["loss"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.filterwarnings(
    "ignore:.*torch.jit.script_method.* is deprecated:DeprecationWarning"
)  # inductor's own
def test_compiled_resume_after_sigkill_matches_uninterrupted_compiled_run(
    demo_dir, compiled_run, tmp_path
):
    straight, stderr = compiled_run["root"] / "compiled", compiled_run["stderr"]
    # Steps of many lengths; something new is compiled on the first two rows only (the second
    # makes the graphs after the attention break dynamic), never once per length.
    lengths = {row["num_tokens"] for row in read_metrics(straight)}
    assert len(lengths) >= 4
    news = re.findall(r"compile: \d+ compilations", stderr)
    assert 1 <= len(news) <= 2 and compilations(stderr) > 0, stderr[-3000:]

    # The kill and resume on one rank: the uninterrupted and the resumed run in this process,
    # the killed one a process of its own (SIGKILL). Compiled layers under FSDP2 on 2 ranks are
    # the run above; a resume on 2 ranks is test_train.py's; two more 2-rank compiled jobs
    # cost this test 30 CPU-s more for no other claim.
    flags = {**FLAGS, "compile": True}
    one = tmp_path / "one"
    assert train_in_process(*base_flags(demo_dir, one, **flags)).returncode == 0
    killed = tmp_path / "killed"
    argv = [
        sys.executable,
        "-m",
        "mini_trainer.train",
        *map(str, base_flags(demo_dir, killed, **flags)),
    ]
    kill_when_saved(argv, killed / "state" / "step_2", timeout=900)

    resumed = train_in_process(*base_flags(demo_dir, killed, **flags, resume=True))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    assert [row["step"] for row in read_metrics(killed)] == list(range(1, 7))
    a = load_file(killed / "final" / "model.safetensors")
    b = load_file(one / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] - b[key]).abs().max().item() <= 1e-6 * max(b[key].abs().max().item(), 1e-12)
