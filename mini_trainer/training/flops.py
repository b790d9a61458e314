"""Model FLOPs per step and model FLOPs utilisation (MFU): throughput comparable across runs.

FLOPs of one training step (forward + backward = 3 forwards), counting matmuls only:
- `6 * N * tokens`, N = the parameters that take part in a matmul: the weight matrices but the
  input embedding (a lookup); a tied LM head counts once, as the output projection (norm gains
  and biases are elementwise, not counted); a mixture of experts' routed experts count the
  share a token uses, top_k / experts. A layer stored otherwise than as its dense weight
  (OSFT's factorized linear: W_high, low factors, bases) says what it stands for
  (`dense_weight_numel`), so MFU counts the same model FLOPs for every method;
- causal attention, per layer and per sample of s tokens: QK^T and AV over the s^2/2 visible
  pairs, 2 * s^2 * d forward (d = heads x head_dim), so `6 * layers * d * sum(s^2)` per step.
  Packed samples attend only to themselves, so it is the sum over samples, not over rows.
Activation-checkpointing recomputation is not counted (the usual MFU convention).

MFU = step FLOPs / (step time x ranks x the device's peak dense bf16 FLOP/s), on CUDA only
(null on the CPU). Peaks, from the vendors' datasheets (dense, no sparsity), matched against
`torch.cuda.get_device_name()` (or `--gpu`, `launch.gpu`) in this order, by whole words of the
name, any case ("NVIDIA A100-SXM4-80GB" is an A100, "L40" is not an L4);
`MINI_TRAINER_PEAK_TFLOPS` overrides:

| device name has the words | peak bf16 dense TFLOP/s |
| --- | ---: |
| H100 PCIe | 756 |
| H100 NVL | 835 |
| H100, H200, GH200 | 989 |
| B200 | 2250 |
| A100 | 312 |
| L40S | 362 |
| L4 | 121 |
| A10 | 125 |
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from torch import nn

from mini_trainer.models.moe import active_fraction

log = logging.getLogger("mini_trainer")

PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10", 125.0),
)
"""(words of the device name, dense bf16 TFLOP/s): the first whose words are all in the name
wins."""


def _words(name: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", name.lower()))


def peak_flops(device_name: str | None) -> float | None:
    """Peak dense bf16 FLOP/s of one device, or None (CPU, or a device not in the table)."""
    override = os.environ.get("MINI_TRAINER_PEAK_TFLOPS")
    if override:
        return float(override) * 1e12
    if device_name is None:
        return None
    words = _words(device_name)
    for key, tflops in PEAK_BF16_TFLOPS:
        if _words(key) <= words:
            return tflops * 1e12
    return None


def matmul_params(model: nn.Module) -> int:
    """Elements of the weight matrices (not norms, biases), each shared one once; a module with
    `dense_weight_numel` counts that instead of its own parameters; a mixture of experts'
    routed experts count top_k / experts of theirs (what one token multiplies)."""
    fraction = active_fraction(model) if hasattr(model, "config") else 1.0
    seen: set[int] = set()
    total = 0.0
    experts_prefixes: list[str] = []
    for name, module in model.named_modules():
        inside = next((p for p in experts_prefixes if name.startswith(p)), None)
        if name.rsplit(".", 1)[-1] == "experts":
            experts_prefixes.append(name + ".")
            inside = name
        share = fraction if inside is not None else 1.0
        own = list(module.parameters(recurse=False))
        dense = getattr(module, "dense_weight_numel", None)
        if dense is not None:
            total += dense * share
            seen.update(map(id, own))
            continue
        for parameter in own:
            # an expert's matrix is 3-D (its 2-D biases are elementwise)
            if parameter.dim() >= (3 if inside else 2) and id(parameter) not in seen:
                seen.add(id(parameter))
                total += parameter.numel() * share
    return round(total)


@dataclass(frozen=True)
class ModelFlops:
    """What a step's FLOPs depend on, read once from the model."""

    matmul_params: int
    layers: int
    attention_dim: int
    peak: float | None
    """Peak FLOP/s of one device (None: no MFU)."""

    @classmethod
    def of(cls, model: nn.Module, device_name: str | None) -> ModelFlops:
        """From a Hugging Face causal LM (sharded or not: DTensor numel is the global one)."""
        config = model.config
        total = matmul_params(model)
        embedding = model.get_input_embeddings().weight
        tied = embedding is model.get_output_embeddings().weight
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        peak = peak_flops(device_name)
        if device_name is not None and peak is None:
            log.warning(
                "no peak FLOP/s known for %s: mfu is null (set MINI_TRAINER_PEAK_TFLOPS)",
                device_name,
            )
        return cls(
            matmul_params=total - (0 if tied else embedding.numel()),
            layers=config.num_hidden_layers,
            attention_dim=heads * head_dim,
            peak=peak,
        )

    def step_flops(self, num_tokens: int, sum_squared_lengths: int) -> float:
        dense = 6.0 * self.matmul_params * num_tokens
        return dense + 6.0 * self.layers * self.attention_dim * sum_squared_lengths

    def step_metrics(
        self, num_tokens: int, sum_squared_lengths: int, seconds: float, devices: int
    ) -> dict:
        """The metrics.jsonl fields of one step."""
        per_device = self.step_flops(num_tokens, sum_squared_lengths) / seconds / devices
        return {
            "tokens_per_second_per_device": num_tokens / seconds / devices,
            "tflops_per_device": per_device / 1e12,
            "mfu": per_device / self.peak if self.peak else None,
        }
