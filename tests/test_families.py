"""Every supported family trains exactly in packed rows: the step-1 loss and every gradient of
our sharded model (FSDP2, our loader, our per-sample attention, our chunked loss) equal
transformers' eager per-sample computation, fp32 on the CPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from families import (
    FAMILIES,
    RTOL,
    build_model,
    eager_reference,
    full_grads,
    relative_error,
    samples,
    sharded_step,
    worst_errors,
)
from helpers import REPO_ROOT, subprocess_env
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from mini_trainer.distributed.runtime import Runtime
from mini_trainer.training.checkpoint import save_hf_checkpoint


@pytest.fixture(scope="module")
def world_of_one():
    """A gloo process group of one rank in this test process (FSDP2 needs one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield Runtime(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    dist.destroy_process_group()


@pytest.mark.parametrize("name", [family.name for family in FAMILIES])
def test_packed_step_equals_transformers_eager_per_sample(name, tmp_path, world_of_one):
    """One rank: loss and every gradient; then the export, reloaded by transformers."""
    model = build_model(name)
    model.save_pretrained(tmp_path / "model")
    batch = samples(model.config.vocab_size)
    want_loss, want_grads = eager_reference(model, batch)

    wrapped, loss = sharded_step(tmp_path / "model", batch, world_of_one)
    assert relative_error(loss, want_loss) <= RTOL, (loss.item(), want_loss.item())
    worst = worst_errors(full_grads(wrapped, 1), want_grads)
    assert worst[0][1] <= RTOL, worst

    # Export: the checkpoint's own key layout and shapes (per-expert tensors again), and
    # transformers loads it to the same logits.
    save_hf_checkpoint(wrapped, model.config, str(tmp_path / "model"), tmp_path / "out",
                       "float32", world_of_one)  # fmt: skip
    assert _shapes(tmp_path / "out") == _shapes(tmp_path / "model")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager")
    ids = torch.tensor([batch[2]["input_ids"]])
    with torch.no_grad():
        want_logits = model(input_ids=ids, use_cache=False).logits
        got_logits = reloaded.eval()(input_ids=ids, use_cache=False).logits
    assert relative_error(got_logits, want_logits) <= RTOL


@pytest.mark.slow
def test_every_family_is_exact_on_two_ranks(tmp_path):
    """Two ranks (torchrun, gloo, FSDP2 shards on both), each packing half the samples: the
    summed loss and every whole gradient equal the single-process eager reference."""
    out = tmp_path / "errors.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(REPO_ROOT / "tests" / "family_ranks.py"),
               str(out), str(tmp_path / "models")]  # fmt: skip
    env = subprocess_env(PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")]))
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    errors = json.loads(out.read_text())
    assert sorted(errors) == sorted(family.name for family in FAMILIES)
    for name, (loss_error, worst) in errors.items():
        assert loss_error <= RTOL, (name, loss_error)
        assert worst[0][1] <= RTOL, (name, worst)


def _shapes(folder) -> dict[str, tuple]:
    with safe_open(folder / "model.safetensors", "pt") as handle:
        return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118
