"""The attention choice, and packed == unpacked for every attention path that runs on CPU.

torch's varlen kernel and flash-attn need CUDA; their shared layout code (`varlen_attention`)
runs here with a reference kernel that implements the same contract in plain sdpa.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import tiny_llama
from transformers import MistralForCausalLM

from mini_trainer.batching.collator import collate_packed
from mini_trainer.training import attention
from mini_trainer.training.loss import chunked_linear_cross_entropy
from mini_trainer.training.model_setup import CausalLMWithLoss

REFERENCE_VARLEN = "mini_trainer_test_varlen_reference"


def test_choice_is_flash_then_torch_varlen_then_per_sample_sdpa():
    expected = {
        (True, True, True): attention.FLASH_NAME,
        (True, True, False): attention.FLASH_NAME,
        (True, False, True): attention.VARLEN_NAME,
        (True, False, False): attention.PER_SAMPLE_NAME,
    }
    for is_cuda, flash, varlen in itertools.product((True, False), repeat=3):
        want = expected.get((is_cuda, flash, varlen), attention.PER_SAMPLE_NAME)
        assert attention.choose_attention(is_cuda, flash, varlen) == want, (is_cuda, flash, varlen)


def test_a_kernel_is_chosen_only_when_it_does_all_the_model_needs():
    choose = attention.choose_attention
    for needs in ([], [attention.WINDOW]):
        assert choose(True, True, True, frozenset(needs)) == attention.FLASH_NAME
        assert choose(True, False, True, frozenset(needs)) == attention.VARLEN_NAME
    softcap = frozenset({attention.WINDOW, attention.SOFTCAP})
    assert choose(True, True, True, softcap) == attention.FLASH_NAME
    assert choose(True, False, True, softcap) == attention.PER_SAMPLE_NAME
    for needs in ({attention.SINKS}, {attention.VALUE_DIM}):
        assert choose(True, True, True, frozenset(needs)) == attention.PER_SAMPLE_NAME


@pytest.mark.parametrize(
    "family, needs",
    [
        ("llama", set()),
        ("qwen2", set()),  # its config has a sliding_window, but use_sliding_window is off
        ("mistral", {attention.WINDOW}),
        ("gemma", set()),
        ("gemma2", {attention.WINDOW, attention.SOFTCAP}),
        ("gemma3_text", {attention.WINDOW}),
        ("gpt_oss", {attention.WINDOW, attention.SINKS}),
        ("deepseek_v3", {attention.VALUE_DIM}),
        ("mixtral", set()),
    ],
)
def test_attention_needs_are_read_off_each_family(family, needs):
    from families import BY_NAME
    from transformers import AutoModelForCausalLM

    config = BY_NAME[family].build()
    config._attn_implementation = "eager"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert attention.attention_needs(model) == needs


def test_this_torch_ships_the_varlen_kernel():
    # torch 2.13 (the pinned version) has it, so on a GPU without flash-attn it is chosen.
    assert attention.torch_varlen_available()


def cpu_paths() -> list[str]:
    attention.register_varlen(REFERENCE_VARLEN, attention.reference_varlen_kernel)
    return [attention.register(attention.PER_SAMPLE_NAME), REFERENCE_VARLEN]


@pytest.mark.parametrize("path", ["per_sample", "varlen"])
@pytest.mark.parametrize("lengths", [[5, 9, 1, 12], [7]])
def test_packed_loss_and_gradients_equal_each_sample_alone(path, lengths):
    name = dict(zip(("per_sample", "varlen"), cpu_paths(), strict=True))[path]
    packed = CausalLMWithLoss(tiny_llama(name), chunked_linear_cross_entropy).train()
    alone = CausalLMWithLoss(tiny_llama("eager"), chunked_linear_cross_entropy).train()
    alone.load_state_dict(packed.state_dict())
    gen = torch.Generator().manual_seed(1)
    samples = []
    for n in lengths:
        ids = torch.randint(0, 97, (n,), generator=gen).tolist()
        labels = [-100 if i % 3 == 0 else t for i, t in enumerate(ids)]
        samples.append({"input_ids": ids, "labels": labels})

    micro = collate_packed(samples, batch_num_loss_tokens=1)
    loss = packed(
        micro.input_ids, micro.position_ids, micro.target_ids, loss_rows=micro.loss_rows,
        **attention.attention_kwargs(name, micro),
    )  # fmt: skip
    loss.backward()
    reference = 0.0
    for sample in samples:
        one = collate_packed([sample], batch_num_loss_tokens=1)
        reference = reference + alone(one.input_ids, None, one.target_ids)
    reference.backward()
    torch.testing.assert_close(loss, reference, atol=1e-5, rtol=1e-5)
    for (key, a), b in zip(packed.named_parameters(), alone.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=key)


def test_varlen_path_applies_sliding_windows_like_the_per_sample_path():
    """A window shorter than the samples: the varlen layout code hands it to the kernel (here
    the reference kernel, with torch's window contract) and matches the per-sample path."""
    from families import BY_NAME

    per_sample, varlen = cpu_paths()
    config = BY_NAME["mistral"].build()
    torch.manual_seed(0)
    config._attn_implementation = per_sample
    a = CausalLMWithLoss(MistralForCausalLM(config), chunked_linear_cross_entropy)
    config_b = BY_NAME["mistral"].build()
    config_b._attn_implementation = varlen
    b = CausalLMWithLoss(MistralForCausalLM(config_b), chunked_linear_cross_entropy)
    b.load_state_dict(a.state_dict())
    gen = torch.Generator().manual_seed(2)
    samples = [
        {"input_ids": (ids := torch.randint(0, 97, (n,), generator=gen).tolist()), "labels": ids}
        for n in (11, 2, 7)
    ]
    micro = collate_packed(samples, batch_num_loss_tokens=1)
    losses = [
        model(
            micro.input_ids,
            micro.position_ids,
            micro.target_ids,
            loss_rows=micro.loss_rows,
            **attention.attention_kwargs(name, micro),
        )  # fmt: skip
        for model, name in ((a, per_sample), (b, varlen))
    ]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)


def test_varlen_path_refuses_input_without_boundaries():
    (_, name) = cpu_paths()
    model = tiny_llama(name)
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        model(input_ids=torch.tensor([[1, 2, 3]]), position_ids=torch.tensor([[0, 1, 2]]))


def test_attention_kwargs_come_from_the_host():
    micro = collate_packed(
        [{"input_ids": [1, 2], "labels": [1, 2]}, {"input_ids": [3], "labels": [3]}], 1
    )
    assert attention.attention_kwargs(attention.PER_SAMPLE_NAME, micro) == {
        "packed_bounds": [[0, 2, 3]]
    }
    kwargs = attention.attention_kwargs(attention.VARLEN_NAME, micro)
    assert kwargs["cu_seq_lens_q"].tolist() == [0, 2, 3] and kwargs["max_length_q"] == 2
    assert attention.attention_kwargs(attention.FLASH_NAME, micro).keys() == kwargs.keys()
