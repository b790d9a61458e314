"""Per-sample attention for packed rows: same logits and gradients as each sample alone."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_llama

from mini_trainer.training.packed_attention import register, segment_bounds


def test_segment_bounds():
    assert segment_bounds(torch.tensor([0, 1, 2, 0, 1, 0])) == [0, 3, 5, 6]
    assert segment_bounds(torch.tensor([0])) == [0, 1]


@pytest.mark.parametrize("lengths", [[5, 9, 1, 12], [7], [3, 3, 3]])
def test_packed_row_matches_each_sample_alone(lengths):
    packed_model = tiny_llama(register()).train()
    single_model = tiny_llama("eager").train()
    single_model.load_state_dict(packed_model.state_dict())
    torch.manual_seed(1)
    samples = [torch.randint(0, 97, (n,)) for n in lengths]
    ids = torch.cat(samples)[None]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]

    packed = packed_model(input_ids=ids, position_ids=positions).logits[0]
    packed.square().sum().backward()
    offset, reference_loss = 0, 0.0
    for sample in samples:
        alone = single_model(input_ids=sample[None]).logits[0]
        torch.testing.assert_close(packed[offset : offset + len(sample)], alone, atol=1e-5, rtol=0)
        reference_loss = reference_loss + alone.square().sum()
        offset += len(sample)
    reference_loss.backward()
    for (name, a), b in zip(
        packed_model.named_parameters(), single_model.parameters(), strict=True
    ):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4, msg=name)


def test_padded_input_falls_back_to_masked_sdpa():
    packed_model = tiny_llama(register()).eval()
    sdpa_model = tiny_llama("sdpa").eval()
    sdpa_model.load_state_dict(packed_model.state_dict())
    ids = torch.randint(0, 97, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        got = packed_model(input_ids=ids, attention_mask=mask).logits
        expected = sdpa_model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=1e-5, rtol=0)


def test_sliding_window_layers_attend_within_their_window():
    """Mistral with a 4-token window: a packed row of long and short samples gives the logits
    of each sample run alone with transformers' own sliding-window mask."""
    from transformers import MistralConfig, MistralForCausalLM

    def tiny_mistral(attention):
        torch.manual_seed(0)
        config = MistralConfig(
            vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, use_cache=False, sliding_window=4,
        )  # fmt: skip
        config._attn_implementation = attention
        return MistralForCausalLM(config).eval()

    packed_model, single_model = tiny_mistral(register()), tiny_mistral("eager")
    single_model.load_state_dict(packed_model.state_dict())
    torch.manual_seed(1)
    lengths = [11, 3, 9]
    samples = [torch.randint(0, 97, (n,)) for n in lengths]
    ids = torch.cat(samples)[None]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        packed = packed_model(input_ids=ids, position_ids=positions).logits[0]
        alone = torch.cat([single_model(input_ids=s[None]).logits[0] for s in samples])
        full_context = tiny_mistral("eager")
        full_context.config.sliding_window = None
        full_context.load_state_dict(packed_model.state_dict())
        unwindowed = full_context(input_ids=samples[0][None]).logits[0]
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(unwindowed, alone[:11], atol=1e-4), "the window changed nothing"
