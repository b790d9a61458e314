"""The paper's adaptive ranks: freeze more of the layers that change their input least.

A decoder layer's importance is the cosine similarity between its input and output hidden
states, averaged over the tokens of a sample of the training data (the base model, before any
training). Its targets get the frozen fraction `mrr + importance * (trr - mrr)`, importance
clamped to [0, 1]: a layer that barely rotates the residual stream keeps more of its subspace.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

SAMPLE_SIZE = 16
"""Training samples the importance is measured on (each up to MAX_SAMPLE_TOKENS tokens)."""
MAX_SAMPLE_TOKENS = 1024


def frozen_fraction(importance: float, min_frozen: float, max_frozen: float) -> float:
    return min_frozen + min(1.0, max(0.0, importance)) * (max_frozen - min_frozen)


def sample_inputs(data_path: Path, seed: int, size: int = SAMPLE_SIZE) -> list[list[int]]:
    """`size` input_ids lists drawn uniformly from the JSONL file (one pass, reservoir)."""
    rng = random.Random(seed)
    chosen: list[str] = []
    with open(data_path, encoding="utf-8") as handle:
        for number, line in enumerate(handle):
            if number < size:
                chosen.append(line)
            elif (slot := rng.randrange(number + 1)) < size:
                chosen[slot] = line
    return [json.loads(line)["input_ids"][:MAX_SAMPLE_TOKENS] for line in chosen if line.strip()]


@torch.no_grad()
def layer_importance(model, samples: list[list[int]]) -> list[float]:
    """Mean cosine similarity between each decoder layer's input and output, over all tokens."""
    layers = list(model.get_decoder().layers)
    sums = torch.zeros(len(layers), dtype=torch.float64)
    tokens = 0
    hooks = []

    def record(index):
        def hook(module, args, kwargs, output):
            hidden_in = args[0] if args else kwargs["hidden_states"]
            hidden_out = output[0] if isinstance(output, tuple) else output
            cosine = torch.nn.functional.cosine_similarity(
                hidden_in.float(), hidden_out.float(), dim=-1
            )
            sums[index] += cosine.double().sum()

        return hook

    for index, layer in enumerate(layers):
        hooks.append(layer.register_forward_hook(record(index), with_kwargs=True))
    try:
        model.eval()
        device = next(model.parameters()).device
        for ids in samples:
            model(input_ids=torch.tensor([ids], device=device), use_cache=False)
            tokens += len(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return (sums / max(tokens, 1)).tolist()


def measure(model_dir: str, data_path: str, seed: int) -> list[float]:
    """Load the base model (fp32, on the GPU when there is one) and measure every layer."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    return layer_importance(model, sample_inputs(Path(data_path), seed))
