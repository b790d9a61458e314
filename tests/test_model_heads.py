"""The training loss equals transformers' own loss for heads that are not plain `hidden @ W.T`:
tied embeddings, soft-capped (Gemma), scaled (Cohere, Granite) logits and an LM-head bias (Phi)."""

from __future__ import annotations

import pytest
import torch

from mini_trainer.training.loss import (
    chunked_linear_cross_entropy,
    linear_cross_entropy_reference,
    logit_head,
)
from mini_trainer.training.model_setup import CausalLMWithLoss

SMALL = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip


def _config(kind: str):
    import transformers as tf

    if kind == "llama_tied":
        return tf.LlamaConfig(**SMALL, tie_word_embeddings=True)
    if kind == "gemma3_softcap":
        return tf.Gemma3TextConfig(**SMALL, head_dim=8, final_logit_softcapping=2.0)
    if kind == "cohere_scale":
        return tf.CohereConfig(**SMALL, logit_scale=0.3)
    if kind == "phi_bias":
        return tf.PhiConfig(**SMALL)
    raise AssertionError(kind)


KINDS = ["llama_tied", "gemma3_softcap", "cohere_scale", "phi_bias"]
"""Llama, Gemma 2's soft-cap and Granite's scale: tests/test_families.py, in packed rows."""


@pytest.mark.parametrize("kind", KINDS)
def test_training_loss_and_gradients_match_transformers(kind):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = _config(kind)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64).train()
    with torch.no_grad():  # make every head feature matter: large logits, a non-zero bias
        model.get_output_embeddings().weight.mul_(8.0)
        if model.get_output_embeddings().bias is not None:
            model.get_output_embeddings().bias.normal_()
    head = logit_head(model.config)
    if kind.endswith("softcap"):
        assert head.softcap == 2.0
    if kind.endswith("scale"):
        assert head.logit_scale in (0.3, 0.25)
    if kind == "phi_bias":
        assert model.get_output_embeddings().bias is not None

    ids = torch.randint(0, config.vocab_size, (1, 12))
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt
    expected = model(input_ids=ids, labels=labels, use_cache=False).loss
    expected.backward()
    want = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    targets = torch.cat([labels[:, 1:], torch.full((1, 1), -100)], dim=1)
    wrapped = CausalLMWithLoss(model, chunked_linear_cross_entropy)
    loss_sum = wrapped(ids, torch.arange(12)[None], targets)
    got = loss_sum / (targets != -100).sum()
    got.backward()
    # transformers computes its loss from fp32 logits: agreement to fp32 rounding.
    torch.testing.assert_close(got.float(), expected, rtol=1e-6, atol=1e-6)
    for name, param in model.named_parameters():
        if name in want:
            torch.testing.assert_close(param.grad, want[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("chunk_size", [3, 100])
def test_chunked_head_transforms_match_the_plain_formula(chunk_size):
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(17, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = (4 * torch.randn(29, 8, generator=gen, dtype=torch.float64)).requires_grad_()
    bias = torch.randn(29, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 29, (17,), generator=gen)
    targets[::4] = -100
    head = {"bias": bias, "logit_scale": 0.7, "softcap": 3.0}
    results = []
    chunked = {"chunk_size": chunk_size}
    for fn, extra in (
        (linear_cross_entropy_reference, {}),
        (chunked_linear_cross_entropy, chunked),
    ):
        for tensor in (hidden, weight, bias):
            tensor.grad = None
        loss = fn(hidden, weight, targets, **head, **extra)
        loss.backward()
        results.append([loss.detach(), hidden.grad.clone(), weight.grad.clone(), bias.grad.clone()])
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_tied_embeddings_train_under_fsdp2_with_transformers_loss(demo_dir, tmp_path):
    """2 ranks, FSDP2: step 1's loss is transformers' loss of the batch, and the exported
    model keeps one tied matrix (trained) for input and output embeddings."""
    import json
    import shutil

    from helpers import base_flags, read_metrics, run_launcher
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from mini_trainer.batching.sampler import BatchSampler

    tied = tmp_path / "tied"
    shutil.copytree(demo_dir / "model", tied)
    config = AutoConfig.from_pretrained(tied)
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tied)
    assert "lm_head.weight" not in load_file(tied / "model.safetensors")

    out = tmp_path / "run"
    data = demo_dir / "data" / "sort.train.jsonl"
    flags = {"model-name-or-path": tied, "data-path": data, "training-mode": "step",
             "max-steps": 2, "save-final-checkpoint": True}  # fmt: skip
    result = run_launcher(*base_flags(demo_dir, out, **flags))
    assert result.returncode == 0, result.stderr

    samples = [json.loads(line) for line in data.read_text().splitlines()]
    batch = BatchSampler(len(samples), 16, 7).next_batch().indices
    base = AutoModelForCausalLM.from_pretrained(tied).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in batch:
            ids = torch.tensor([samples[i]["input_ids"]])
            labels = torch.tensor([samples[i]["labels"]])
            n = int((labels[0, 1:] != -100).sum())
            total += base(input_ids=ids, labels=labels, use_cache=False).loss.item() * n
            count += n
    assert read_metrics(out)[0]["loss"] == pytest.approx(total / count, rel=1e-5)

    exported = AutoModelForCausalLM.from_pretrained(out / "final")
    assert exported.lm_head.weight.data_ptr() == exported.model.embed_tokens.weight.data_ptr()
    assert "lm_head.weight" not in load_file(out / "final" / "model.safetensors")
    assert not torch.equal(exported.model.embed_tokens.weight, base.model.embed_tokens.weight)
