"""Every supported family trains exactly in packed rows: the step-1 loss and every gradient of
our sharded model (FSDP2, our loader, our per-sample attention, our chunked loss) equal
transformers' eager per-sample computation, fp32 on the CPU."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from families import BY_NAME, FAMILIES
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from mini_trainer.batching.collator import collate_packed
from mini_trainer.distributed.runtime import Runtime
from mini_trainer.method import FullFineTuning
from mini_trainer.training import attention
from mini_trainer.training.checkpoint import save_hf_checkpoint
from mini_trainer.training.loss import chunked_linear_cross_entropy
from mini_trainer.training.model_setup import ModelSpec, build_model

RTOL = 1e-5
"""Relative error allowed, tensor by tensor (fp32 rounding of sums taken in another order)."""
LENGTHS = [9, 3, 14, 6]
"""Samples of a packed row: two longer than every window, one shorter."""


@pytest.fixture(scope="module")
def world_of_one():
    """A gloo process group of one rank in this test process (FSDP2 needs one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield Runtime(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    dist.destroy_process_group()


def samples(vocab: int, lengths=LENGTHS) -> list[dict]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for n in lengths:
        ids = torch.randint(3, vocab, (n,), generator=gen).tolist()
        labels = [-100 if i < 2 else t for i, t in enumerate(ids)]
        out.append({"input_ids": ids, "labels": labels})
    return out


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """|got - want| / |want| in the Frobenius norm: one number per tensor, so an element that
    is a sum of cancelling terms (near zero) does not dominate."""
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def eager_reference(model, batch):
    """Summed token loss of each sample run alone by transformers (eager attention), and the
    gradients of that sum."""
    model.zero_grad(set_to_none=True)
    total = 0.0
    for sample in batch:
        ids = torch.tensor([sample["input_ids"]])
        labels = torch.tensor([sample["labels"]])
        n = int((labels[0, 1:] != -100).sum())
        out = model(input_ids=ids, labels=labels, use_cache=False)
        total = total + out.loss * n
    total.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return total.detach(), grads


@pytest.mark.parametrize("name", [family.name for family in FAMILIES])
def test_packed_step_equals_transformers_eager_per_sample(name, tmp_path, world_of_one):
    torch.manual_seed(0)
    config = BY_NAME[name].build()
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).train()
    model.save_pretrained(tmp_path / "model")
    batch = samples(config.vocab_size)
    want_loss, want_grads = eager_reference(model, batch)

    wrapped, _ = build_model(
        ModelSpec(str(tmp_path / "model")), chunked_linear_cross_entropy, world_of_one,
        FullFineTuning(),
    )  # fmt: skip
    wrapped.train()
    name_attn = wrapped.model.config._attn_implementation
    micro = collate_packed(batch, batch_num_loss_tokens=1)
    loss = wrapped(
        micro.input_ids, micro.position_ids, micro.target_ids, loss_rows=micro.loss_rows,
        **attention.attention_kwargs(name_attn, micro),
    )  # fmt: skip
    loss.backward()
    assert relative_error(loss.detach(), want_loss) <= RTOL, (loss.item(), want_loss.item())
    got = {
        key.removeprefix("model."): p.grad.full_tensor()
        for key, p in wrapped.named_parameters()
        if p.grad is not None
    }
    assert set(got) == set(want_grads)
    errors = {key: relative_error(got[key], grad) for key, grad in want_grads.items()}
    assert max(errors.values()) <= RTOL, sorted(errors.items(), key=lambda kv: -kv[1])[:3]

    # Export: the checkpoint's own key layout and shapes (per-expert tensors again), and
    # transformers loads it to the same logits.
    save_hf_checkpoint(wrapped, config, str(tmp_path / "model"), tmp_path / "out", "float32",
                       world_of_one)  # fmt: skip
    assert _shapes(tmp_path / "out") == _shapes(tmp_path / "model")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager")
    ids = torch.tensor([batch[2]["input_ids"]])
    with torch.no_grad():
        want_logits = model(input_ids=ids, use_cache=False).logits
        got_logits = reloaded.eval()(input_ids=ids, use_cache=False).logits
    assert relative_error(got_logits, want_logits) <= RTOL


def _shapes(folder) -> dict[str, tuple]:
    with safe_open(folder / "model.safetensors", "pt") as handle:
        return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118
