"""The method seam: full fine-tuning's parameter groups (no decay on norms and biases)."""

from __future__ import annotations

import helpers
import torch

from mini_trainer.method import FullFineTuning, decay_param_groups


def tiny_llama(**overrides):
    return helpers.tiny_llama(
        seed=None, vocab_size=64, hidden_size=16, intermediate_size=32, num_attention_heads=2,
        num_key_value_heads=1, **overrides,
    )  # fmt: skip


def names_of(model, group) -> set[str]:
    ids = {id(p) for p in group["params"]}
    return {name for name, p in model.named_parameters() if id(p) in ids}


def test_norms_and_biases_are_not_decayed_and_every_trainable_parameter_is_grouped():
    model = tiny_llama(attention_bias=True)
    groups = {g["name"]: g for g in decay_param_groups(model, 0.1)}
    decayed, kept = names_of(model, groups["decay"]), names_of(model, groups["no_decay"])
    assert groups["decay"]["weight_decay"] == 0.1 and groups["no_decay"]["weight_decay"] == 0.0
    assert "model.norm.weight" in kept and "model.layers.0.input_layernorm.weight" in kept
    assert "model.layers.0.self_attn.q_proj.bias" in kept
    assert "model.layers.0.self_attn.q_proj.weight" in decayed
    assert "model.embed_tokens.weight" in decayed
    assert not decayed & kept
    assert decayed | kept == {n for n, _ in model.named_parameters()}


def test_frozen_parameters_are_left_out_and_adamw_leaves_norms_alone():
    model = tiny_llama()
    model.model.embed_tokens.weight.requires_grad_(False)
    groups = FullFineTuning().param_groups(model, weight_decay=0.5)
    grouped = set().union(*(names_of(model, g) for g in groups))
    assert "model.embed_tokens.weight" not in grouped
    norm_before = model.model.norm.weight.detach().clone()
    proj_before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    optimizer = torch.optim.AdamW(groups, lr=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # a zero gradient: only weight decay can move a weight
    optimizer.step()
    assert torch.equal(model.model.norm.weight, norm_before)
    assert torch.allclose(model.model.layers[0].mlp.up_proj.weight, proj_before * (1 - 0.1 * 0.5))
