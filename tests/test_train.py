"""The training engine end to end: real torchrun, gloo, FSDP2 on CPU, the demo model."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from helpers import (
    REPO_ROOT,
    base_flags,
    kill_when_saved,
    read_metrics,
    run_torchrun,
    subprocess_env,
    torchrun_command,
    train_in_process,
)
from safetensors.torch import load_file

pytestmark = pytest.mark.slow


def final_weights(out):
    return load_file(out / "final" / "model.safetensors")


def assert_weights_close(a, b, rtol):
    assert a.keys() == b.keys()
    for key in a:
        diff = (a[key] - b[key]).abs().max().item()
        scale = b[key].abs().max().item()
        assert diff <= rtol * max(scale, 1e-12), f"{key}: max diff {diff:.3g} (scale {scale:.3g})"


def test_loss_falls_and_final_loads_with_transformers(demo_dir, tmp_path):
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    # One rank, in this process. Two ranks' export against their sharded state:
    # test_osft_train.py (50 steps, 2 ranks) and test_models_io.py (streaming export, 2 ranks).
    out = tmp_path / "run"
    result = train_in_process(
        *base_flags(
            demo_dir,
            out,
            **{
                "training-mode": "step",
                "max-steps": 60,
                "save-every-steps": 60,
                "save-final-checkpoint": True,
                "lr-scheduler": "cosine",
                "num-warmup-steps": 5,
            },
        )
    )
    assert result.returncode == 0, result.stderr
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, 61))
    first, last = sum(r["loss"] for r in rows[:5]) / 5, sum(r["loss"] for r in rows[-5:]) / 5
    assert last < 0.6 * first, (first, last)
    from mini_trainer.training.metrics import METRIC_FIELDS

    assert set(rows[-1]) == set(METRIC_FIELDS)
    assert rows[-1]["samples_seen"] == 60 * 16
    args = json.loads((out / "training_args.json").read_text())
    assert args["max_steps"] == 60 and args["lr_scheduler"] == "cosine"

    # final/ holds exactly the training model's weights: compare with the saved state.
    exported = AutoModelForCausalLM.from_pretrained(out / "final").eval()
    trained = AutoModelForCausalLM.from_pretrained(demo_dir / "model").eval()
    state = {"model": {f"model.{k}": v for k, v in trained.state_dict().items()}}
    dcp.load(state, checkpoint_id=str(out / "state" / "step_60"))
    trained.load_state_dict({k.removeprefix("model."): v for k, v in state["model"].items()})
    ids = torch.tensor(
        [
            json.loads(line)["input_ids"]
            for line in (demo_dir / "data/sort_plus1.eval.jsonl").read_text().splitlines()[:1]
        ]
    )
    with torch.no_grad():
        expected = trained(input_ids=ids, use_cache=False).logits
        got = exported(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(
        got, AutoModelForCausalLM.from_pretrained(demo_dir / "model")(input_ids=ids).logits
    ), "the exported model is still the untrained one"


def _one_step(demo_dir, data, out, nproc, cap, defer_grad_sync=False):
    """One step under torchrun (2 ranks) or, for one rank, in this process (the same job)."""
    flags = base_flags(
        demo_dir,
        out,
        **{
            "defer-grad-sync": defer_grad_sync,
            "data-path": data,
            "training-mode": "step",
            "max-steps": 1,
            "batch-size": 24,
            "max-tokens-per-gpu": cap,
            "save-final-checkpoint": True,
            "learning-rate": 1.0,
            "eps": 1.0,
            "grad-clip": 0,
            "weight-decay": 0.0,
        },
    )
    if nproc == 1:
        assert train_in_process(*flags).returncode == 0
    else:
        run_torchrun(*flags, nproc=nproc)
    return read_metrics(out)[0], final_weights(out)


def _cap_for_micro_batches(data, wanted, ranks):
    """The token cap under which the file's 24 samples pack into `wanted` micro-batches."""
    from mini_trainer.batching.collator import plan_step
    from mini_trainer.data.validate import build_index

    index, _ = build_index(data, 10**6, 10**6)
    lengths, loss_tokens = index["len"].to_numpy(), index["loss_tokens"].to_numpy()
    everything = np.arange(len(index))
    for cap in range(int(lengths.max()), int(lengths.sum()) + 1):
        if plan_step(everything, lengths, loss_tokens, ranks, cap).num_micro_batches == wanted:
            return cap
    raise AssertionError(f"no cap gives {wanted} micro-batches")


def test_step_is_exact_whatever_the_split(demo_dir, tmp_path):
    # One global batch of 24 samples of widely varying lengths (the file's first 24 under 100).
    lines = (demo_dir / "data/sort_plus1.train.jsonl").read_text().splitlines()
    short = [line for line in lines if json.loads(line)["len"] < 100][:24]
    data = tmp_path / "batch.jsonl"
    data.write_text("\n".join(short) + "\n")

    whole_row, whole = _one_step(demo_dir, data, tmp_path / "one", 1, 100_000)
    six_row, six = _one_step(
        demo_dir, data, tmp_path / "six", 1, _cap_for_micro_batches(data, 6, 1)
    )
    two_row, two = _one_step(
        demo_dir, data, tmp_path / "two", 2, _cap_for_micro_batches(data, 3, 2)
    )
    # Gradients reduce-scattered once, after the last of the 3 micro-batches: the same step.
    deferred_row, deferred = _one_step(
        demo_dir, data, tmp_path / "deferred", 2, _cap_for_micro_batches(data, 3, 2), True
    )
    assert whole_row["num_micro_batches"] == 1
    assert six_row["num_micro_batches"] == 6
    assert two_row["num_micro_batches"] == deferred_row["num_micro_batches"] == 3
    for row in (six_row, two_row, deferred_row):
        assert row["num_loss_tokens"] == whole_row["num_loss_tokens"]
        assert row["loss"] == pytest.approx(whole_row["loss"], rel=1e-5)
        assert row["grad_norm"] == pytest.approx(whole_row["grad_norm"], rel=1e-5)
    base = load_file(demo_dir / "model" / "model.safetensors")
    moved = max((whole[k] - base[k]).abs().max().item() for k in base)
    assert moved > 1e-4, "the step did not change the weights"
    assert_weights_close(six, whole, rtol=1e-5)
    assert_weights_close(two, whole, rtol=1e-5)
    assert_weights_close(deferred, whole, rtol=1e-5)


def test_resume_after_sigkill_matches_uninterrupted_run(demo_dir, tmp_path):
    """2 ranks: a run SIGKILLed while a background save (--async-save) writes a state, resumed,
    ends with the weights of an uninterrupted synchronous run, bit for bit."""
    flags = {
        "training-mode": "step",
        "max-steps": 20,
        "save-final-checkpoint": True,
        "batch-size": 32,
    }
    straight = tmp_path / "straight"
    run_torchrun(*base_flags(demo_dir, straight, **flags))

    killed = tmp_path / "killed"
    saving = {"save-every-steps": 5, "async-save": True}
    argv = torchrun_command(*base_flags(demo_dir, killed, **flags, **saving))

    def writing():  # a published state, and a later one's files being written
        return (killed / "state" / "step_5").exists() and any(
            (killed / "state").glob(".step_*.tmp-*/*.distcp")
        )

    for _ in range(3):  # killed during the write (its folder left unpublished), not after it
        shutil.rmtree(killed, ignore_errors=True)
        kill_when_saved(argv, killed / "state" / "step_5", ready=writing)
        interrupted = [
            p.name for p in (killed / "state").glob(".step_*.tmp-*") if any(p.glob("*.distcp"))
        ]
        published = [p.name for p in (killed / "state").glob("step_*")]
        if interrupted:
            break
    assert interrupted, "never killed during a background write"
    unpublished = interrupted[0].split(".tmp-")[0][1:]  # .step_K.tmp-xxxx -> step_K
    assert unpublished not in published and "step_5" in published
    assert not (killed / "state" / "step_20").exists(), "killed too late to test a resume"

    # The resumed run keeps only the newest state (--keep-states 1): older ones are pruned; its
    # start removed the interrupted write's temporary folder.
    resumed = {**saving, "resume": True, "keep-states": 1}
    result = run_torchrun(*base_flags(demo_dir, killed, **flags, **resumed))
    resumed_at = int(result.stderr.split("resumed from ")[1].split("(step ")[1].split(")")[0])
    assert 5 <= resumed_at < int(unpublished.removeprefix("step_"))
    assert [r["step"] for r in read_metrics(killed)] == list(range(1, 21))
    got, expected = final_weights(killed), final_weights(straight)
    assert all(torch.equal(got[key], expected[key]) for key in expected)
    states = sorted(p.name for p in (killed / "state").iterdir())
    assert states == ["step_20"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])  # SIGUSR1: test_launcher
def test_signal_saves_state_and_exits_with_documented_status(demo_dir, tmp_path, signum):
    """SIGTERM's run saves in the background after every step (--async-save): the stop waits
    for the write in flight and its own, and exits 75 with the last step's state published."""
    from mini_trainer.distributed.preemption import EXIT_PREEMPTED

    out = tmp_path / "run"
    saving = {"async-save": True, "save-every-steps": 1, "keep-states": 1}
    argv = [
        sys.executable,
        "-m",
        "mini_trainer.train",
        *base_flags(demo_dir, out, **{"training-mode": "infinite"},
                    **(saving if signum == signal.SIGTERM else {})),
    ]  # fmt: skip
    process = subprocess.Popen(
        argv,
        env=subprocess_env(),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == EXIT_PREEMPTED, stderr
    assert "Traceback" not in stderr
    assert f"stopped by {signal.Signals(signum).name}" in stderr
    states = list((out / "state").iterdir())  # no temporary folder left either
    assert len(states) == 1 and states[0].name.startswith("step_")
    step = int(states[0].name.removeprefix("step_"))
    assert read_metrics(out)[-1]["step"] == step
    assert (states[0] / "trainer_state.json").is_file()


def test_data_index_activation_checkpointing_and_wandb_offline(demo_dir, tmp_path):
    from helpers import run_cli

    data = demo_dir / "data" / "sort.train.jsonl"
    index = tmp_path / "sort.parquet"
    run_cli(
        "validate", data, "--model", demo_dir / "model", "--max-tokens-per-gpu", 512,
        "--out-index", index, "--out-summary", tmp_path / "sort.json", check=True,
    )  # fmt: skip
    out = tmp_path / "run"
    # One rank, a child (`python -m mini_trainer.train`: wandb starts its own service process).
    flags = {"data-index": index, "activation-checkpointing": True, "training-mode": "step",
             "wandb-project": "mini-trainer-test", "max-steps": 3}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "mini_trainer.train",
         *base_flags(demo_dir, out, task="sort", **flags)],
        capture_output=True, text=True, env=subprocess_env(WANDB_MODE="offline"), cwd=REPO_ROOT,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    assert "attention implementation: mini_trainer_packed" in result.stderr
    assert "activation checkpointing: every decoder layer" in result.stderr
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb")), runs

    # An index validated for a larger cap than the job's is refused with one clear line.
    small = {"data-index": index, "max-tokens-per-gpu": 64}
    result = train_in_process(*base_flags(demo_dir, tmp_path / "small", task="sort", **small))
    assert result.returncode == 2
    assert "--data-index: holds a" in result.stderr and "--max-tokens-per-gpu 64" in result.stderr
    assert not (tmp_path / "small" / "metrics.jsonl").exists()

    # An index checked against a larger vocabulary than the model's is refused too.
    bigger = tmp_path / "bigger-model"
    bigger.mkdir()
    config = json.loads((demo_dir / "model" / "config.json").read_text())
    (bigger / "config.json").write_text(json.dumps({**config, "vocab_size": 10_000}))
    wide_index = tmp_path / "wide.parquet"
    run_cli(
        "validate", data, "--model", bigger, "--max-tokens-per-gpu", 512,
        "--out-index", wide_index, "--out-summary", tmp_path / "wide.json", check=True,
    )  # fmt: skip
    result = train_in_process(
        *base_flags(demo_dir, tmp_path / "wide", task="sort", **{"data-index": wide_index})
    )
    assert result.returncode == 2
    assert "checked against a vocabulary of 10000" in result.stderr, result.stderr


def test_epoch_mode_with_epoch_and_sample_checkpoints(demo_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    lines = (demo_dir / "data/sort_desc.train.jsonl").read_text().splitlines()[:40]
    data = tmp_path / "forty.jsonl"
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    result = train_in_process(  # one rank, in this process: batches and epochs are global
        *base_flags(
            demo_dir,
            out,
            **{
                "data-path": data,
                "max-epochs": 2,
                "checkpoint-at-epoch": True,
                "min-samples-per-checkpoint": 30,
                "lr-scheduler": "linear",
            },
        )
    )
    assert result.returncode == 0, result.stderr
    rows = read_metrics(out)
    # 40 samples in batches of 16: 16, 16, 8 per epoch, every sample once per epoch.
    assert [r["samples_seen"] for r in rows] == [16, 32, 40, 56, 72, 80]
    assert [r["epoch"] for r in rows] == [0, 0, 0, 1, 1, 1]
    assert rows[-1]["lr"] > 0 and rows[0]["lr"] > rows[-1]["lr"]
    saved = sorted(p.name for p in (out / "hf_format").iterdir())
    # samples_32 (30 more seen), samples_40 (epoch end), samples_72 (30 more), samples_80 (end).
    assert saved == ["samples_32", "samples_40", "samples_72", "samples_80"]
    assert not (out / "final").exists()
    model = AutoModelForCausalLM.from_pretrained(out / "hf_format" / "samples_80")
    assert model.config.use_cache is True
