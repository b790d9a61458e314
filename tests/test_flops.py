"""Model FLOPs: the formula against torch's own FLOP counter, and the peak table."""

from __future__ import annotations

import pytest
import torch
from test_osft import osft_args
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

from mini_trainer.osft.linear import OSFTLinear
from mini_trainer.osft.method import OSFT
from mini_trainer.training.flops import ModelFlops, peak_flops


@pytest.mark.parametrize("tied", [False, True])
def test_step_flops_match_torch_flop_counter(tied):
    config = LlamaConfig(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied, use_cache=False,
    )  # fmt: skip
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config)
    tokens = 24
    ids = torch.randint(0, 101, (1, tokens))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids).logits.sum().backward()
    flops = ModelFlops.of(model, None)
    assert flops.peak is None
    # The counter charges eager attention for all s^2 pairs; the formula for the causal half.
    full_attention = 6 * flops.layers * flops.attention_dim * tokens**2
    assert counter.get_total_flops() == flops.step_flops(tokens, tokens**2) + full_attention


def test_metrics_and_peaks(monkeypatch):
    monkeypatch.delenv("MINI_TRAINER_PEAK_TFLOPS", raising=False)
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("NVIDIA L40S") == 362e12 and peak_flops("NVIDIA L4") == 121e12
    assert peak_flops("Some Future GPU") is None and peak_flops(None) is None
    # Whole words, any case: a name that merely contains another is not it.
    assert peak_flops("NVIDIA L40") is None and peak_flops("NVIDIA A10G") is None
    assert peak_flops("h100") == 989e12 and peak_flops("NVIDIA GH200 480GB") == 989e12
    assert peak_flops("NVIDIA H100 NVL") == 835e12 and peak_flops("NVIDIA A10") == 125e12
    flops = ModelFlops(matmul_params=10, layers=1, attention_dim=2, peak=None)
    row = flops.step_metrics(num_tokens=4, sum_squared_lengths=8, seconds=2.0, devices=2)
    assert row == {"tokens_per_second_per_device": 1.0, "tflops_per_device": 336 / 4 / 1e12,
                   "mfu": None}  # fmt: skip
    monkeypatch.setenv("MINI_TRAINER_PEAK_TFLOPS", "0.000000000084")
    on_gpu = ModelFlops.of(LlamaForCausalLM(LlamaConfig(
        vocab_size=11, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
        num_attention_heads=2)), "anything")  # fmt: skip
    assert on_gpu.peak == pytest.approx(84.0)
    assert ModelFlops(10, 1, 2, 84.0).step_metrics(4, 8, 2.0, 2)["mfu"] == pytest.approx(1.0)


def test_osft_counts_the_dense_model_flops_it_stands_for(tmp_path):
    """OSFT stores each target as W_high, low factors and bases (about 3x the weight's
    elements with its bases): MFU still counts the dense model's FLOPs, as for SFT."""
    config = LlamaConfig(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, use_cache=False,
    )  # fmt: skip
    with torch.device("meta"):
        dense, adapted = LlamaForCausalLM(config), LlamaForCausalLM(config)
    OSFT(osft_args(tmp_path)).adapt_model(adapted)
    assert any(isinstance(module, OSFTLinear) for module in adapted.modules())
    stored = sum(p.numel() for p in adapted.parameters() if p.dim() >= 2)
    assert stored > 1.5 * sum(p.numel() for p in dense.parameters() if p.dim() >= 2)
    assert ModelFlops.of(adapted, None) == ModelFlops.of(dense, None)


def test_routed_experts_count_the_share_a_token_uses_and_osft_keeps_the_count(tmp_path):
    """Mixtral with 2 of 4 experts: the experts' matrices count half; an OSFT-factorized copy
    (experts and linears stood in for by their factors) counts the same as the dense model."""
    from families import build_model
    from test_osft import adapted

    from mini_trainer.training.flops import matmul_params

    model = build_model("mixtral")
    experts = sum(
        p.numel() for n, p in model.named_parameters() if ".experts." in n and p.dim() == 3
    )
    dense = sum(
        p.numel() for n, p in model.named_parameters() if p.dim() == 2 and ".experts." not in n
    )
    assert matmul_params(model) == dense + experts // 2
    _, factorized = adapted(model, osft_args(tmp_path))
    assert matmul_params(factorized) == matmul_params(model)
