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
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from mini_trainer.errors import UserError
from mini_trainer.models.loading import init_non_persistent_buffers, load_targets
from mini_trainer.models.safetensors_file import checkpoint_tensors, read_tensor

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


def measure(model_dir: str, data_path: str, seed: int) -> list[float]:
    """Every decoder layer's importance for the base model in `model_dir` (fp32, on the GPU when
    there is one), over a sample of the training data."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return streamed_importance(Path(model_dir), sample_inputs(Path(data_path), seed), device)


class _Measured(Exception):
    """Raised once the measured layer has run: the rest of the forward is not needed."""


@torch.no_grad()
def streamed_importance(
    model_dir: Path, samples: list[list[int]], device: torch.device
) -> list[float]:
    """Mean cosine similarity between each decoder layer's input and output, over all tokens,
    holding one decoder layer's weights at a time (issue 19.6: no rank holds the whole model).

    The model is built on the meta device; the samples' input embeddings are computed with the
    embedding alone. Then layer by layer: its weights are read from the checkpoint, every
    sample runs through the model's own forward (so each layer gets the mask and position
    embeddings that model computes for it), with the earlier layers replaying their recorded
    outputs and the forward stopping after the measured layer; the layer's weights are
    dropped. Host memory: the embedding or one layer, plus one hidden state per sample. Each
    sample runs alone, as before, so the values are those of the whole-model forward.
    """
    if not samples:
        raise UserError("--osft-rank-mode adaptive: the training data has no samples to measure")
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    entries = checkpoint_tensors(model_dir)
    prefixes = {id(module): f"{name}." for name, module in model.named_modules()}
    decoder = model.get_decoder()
    layers = list(decoder.layers)
    embedding = model.get_input_embeddings()

    def load(module: nn.Module) -> None:
        module.to_empty(device=device)
        targets, _ = load_targets(module)
        for name, target in targets.items():
            key = prefixes[id(module)] + name
            if key not in entries:
                raise UserError(f"{model_dir}: {key}: not in the checkpoint")
            target.copy_(read_tensor(entries[key]))

    skipped = {id(embedding), id(decoder.layers)}
    for child in decoder.children():  # rotary embedding, final norm: small
        if id(child) not in skipped:
            load(child)
    init_non_persistent_buffers(decoder, device)
    load(embedding)
    hidden: list = [embedding(torch.tensor([ids], device=device)) for ids in samples]
    embedding.to_empty(device="meta")

    sums = torch.zeros(len(layers), dtype=torch.float64)
    as_tuple = False  # how this model's layers return their output (set by the first one)
    for index, layer in enumerate(layers):
        load(layer)
        outputs: list[torch.Tensor] = []

        def measured(module, args, kwargs, output, index=index, outputs=outputs):
            nonlocal as_tuple
            hidden_in = args[0] if args else kwargs["hidden_states"]
            as_tuple = isinstance(output, tuple)
            hidden_out = output[0] if as_tuple else output
            cosine = torch.nn.functional.cosine_similarity(
                hidden_in.float(), hidden_out.float(), dim=-1
            )
            sums[index] += cosine.double().sum().cpu()
            outputs.append(hidden_out)
            raise _Measured

        hook = layer.register_forward_hook(measured, with_kwargs=True)
        try:
            for sample, recorded in enumerate(hidden):
                if index > 0:  # the layers before replay: inputs_embeds only gives the shape
                    for earlier in layers[: index - 1]:
                        earlier.forward = _passing_on(as_tuple)
                    layers[index - 1].forward = _replaying(recorded, as_tuple)
                try:
                    decoder(
                        inputs_embeds=recorded if index == 0 else torch.zeros_like(recorded),
                        use_cache=False,
                    )
                except _Measured:
                    hidden[sample] = None  # its successor is in `outputs`
                    continue
                raise RuntimeError(f"decoder layer {index} did not run")  # pragma: no cover
        finally:
            hook.remove()
            for earlier in layers[:index]:
                earlier.__dict__.pop("forward", None)
        layer.to_empty(device="meta")
        hidden = outputs
    return (sums / sum(len(ids) for ids in samples)).tolist()


def _passing_on(as_tuple: bool):
    """A layer's forward that returns its input (its output is replayed further on)."""

    def forward(*args, **kwargs):
        hidden_states = args[0] if args else kwargs["hidden_states"]
        return (hidden_states,) if as_tuple else hidden_states

    return forward


def _replaying(output: torch.Tensor, as_tuple: bool):
    """A layer's forward that returns the output it recorded for this sample."""

    def forward(*args, **kwargs):
        return (output,) if as_tuple else output

    return forward
