"""Adaptive OSFT's importance measured layer by layer from the checkpoint equals the
measurement on the whole model loaded at once (the computation before issue 19.6, kept in
helpers.py: `whole_model_importance`, which benchmarks/load_export.py also runs)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import tiny_llama, whole_model_importance

from mini_trainer.osft.adaptive import sample_inputs, streamed_importance


def test_streamed_importance_equals_the_whole_model_on_the_demo_model(demo_dir):
    model_dir = demo_dir / "model"
    (data,) = sorted((demo_dir / "data").glob("*.jsonl"))[:1]
    samples = sample_inputs(data, seed=3)
    assert len({len(ids) for ids in samples}) > 1  # the padding and masking are exercised
    streamed = streamed_importance(model_dir, samples, torch.device("cpu"))
    whole = whole_model_importance(model_dir, samples)
    assert len(streamed) == len(whole) > 1
    torch.testing.assert_close(torch.tensor(streamed), torch.tensor(whole), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tied", [False, True])
def test_streamed_importance_equals_the_whole_model_on_uneven_layers(tmp_path, tied):
    model = tiny_llama(
        vocab_size=64, intermediate_size=48, num_hidden_layers=3, tie_word_embeddings=tied,
        use_cache=True,
    )  # fmt: skip
    with torch.no_grad():  # layers that keep, mix and rewrite their input
        model.model.layers[0].mlp.down_proj.weight.mul_(1e-3)
        model.model.layers[2].mlp.down_proj.weight.mul_(20.0)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "model")  # stored bf16, measured fp32
    rows = [{"input_ids": [(3 * i + j) % 64 for j in range(5 + i)]} for i in range(20)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = sample_inputs(tmp_path / "data.jsonl", seed=0)
    streamed = streamed_importance(tmp_path / "model", samples, torch.device("cpu"))
    whole = whole_model_importance(tmp_path / "model", samples)
    assert streamed[0] > streamed[1] > streamed[2]
    torch.testing.assert_close(torch.tensor(streamed), torch.tensor(whole), rtol=1e-6, atol=1e-6)
