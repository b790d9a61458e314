"""A mixture of experts trained by the real training job (one rank, in this process): its
routing in metrics.jsonl. Apart from test_families.py, whose module-scoped process group would
clash with the job's own."""

from __future__ import annotations

import json

import pytest
import torch
from families import build_model
from safetensors import safe_open


def _shapes(folder) -> dict[str, tuple]:
    with safe_open(folder / "model.safetensors", "pt") as handle:
        return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118


def test_training_a_mixture_of_experts_logs_its_routing(demo_dir, tmp_path):
    """A real one-rank training job (the demo task, a tiny Mixtral with the demo tokenizer and
    the router's aux loss on): every metrics row has `aux_loss` and `expert_tokens`, whose sum
    is every routed token x top-k x layer; the logged `loss` is the LM's alone; final/ keeps
    the checkpoint's per-expert layout."""
    import shutil

    from helpers import base_flags, read_metrics, train_in_process
    from transformers import AutoConfig

    from mini_trainer.batching.sampler import BatchSampler

    vocab = AutoConfig.from_pretrained(demo_dir / "model").vocab_size
    model = build_model("mixtral", vocab_size=vocab, output_router_logits=True)
    folder = tmp_path / "mixtral"
    model.save_pretrained(folder)
    for tokenizer_file in (demo_dir / "model").glob("*token*"):
        shutil.copy(tokenizer_file, folder)
    flags = {"model-name-or-path": folder, "training-mode": "step", "max-steps": 2,
             "batch-size": 8, "save-final-checkpoint": True}  # fmt: skip
    result = train_in_process(*base_flags(demo_dir, tmp_path / "run", **flags))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 2
    for row in rows:
        assert row["aux_loss"] > 0 and len(row["expert_tokens"]) == 4
        layers = model.config.num_hidden_layers
        assert sum(row["expert_tokens"]) == row["num_tokens"] * 2 * layers
    assert _shapes(tmp_path / "run" / "final") == _shapes(folder)

    # step 1's logged loss: the batch's LM token mean, without the aux term
    data = demo_dir / "data" / "sort_plus1.train.jsonl"
    lines = [json.loads(line) for line in data.read_text().splitlines()]
    total, count = 0.0, 0
    with torch.no_grad():
        for i in BatchSampler(len(lines), 8, 7).next_batch().indices:
            ids, labels = torch.tensor([lines[i]["input_ids"]]), torch.tensor([lines[i]["labels"]])
            n = int((labels[0, 1:] != -100).sum())
            out = model(input_ids=ids, labels=labels, use_cache=False, output_router_logits=False)
            total, count = total + out.loss.item() * n, count + n
    assert rows[0]["loss"] == pytest.approx(total / count, rel=1e-5)
