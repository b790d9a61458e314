"""Tiny random models of every supported family, built from transformers' own config classes.

Each entry sets the features that family trains with to values that matter in a 2-layer,
32-wide model on samples of up to ~16 tokens: windows shorter than the samples, soft-caps small
enough to bend the logits, several experts with top-2 routing. Shared by the family tests and
docs/training.md's supported-families table (`scripts/families_table.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers as tf

SMALL = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "bos_token_id": 1, "eos_token_id": 2,
         "pad_token_id": 0}  # fmt: skip
WINDOW = 4
"""Sliding windows, shorter than the test samples."""
MOE = {"num_experts_per_tok": 2}


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[], tf.PreTrainedConfig]
    exercises: str
    """What this family adds to the packed path, for the docs table."""


def _layers(*kinds: str) -> list[str]:
    return list(kinds)


FAMILIES = [
    Family("llama", lambda: tf.LlamaConfig(**SMALL), "the dense baseline: GQA, RoPE, SwiGLU"),
    Family("qwen2", lambda: tf.Qwen2Config(**SMALL), "q/k/v biases"),
    Family("qwen3", lambda: tf.Qwen3Config(**SMALL, head_dim=8), "q/k norms"),
    Family(
        "mistral",
        lambda: tf.MistralConfig(**SMALL, sliding_window=WINDOW),
        "a sliding window shorter than the samples",
    ),
    Family("phi3", lambda: tf.Phi3Config(**SMALL), "fused qkv_proj and gate_up_proj"),
    Family(
        "granite",
        lambda: tf.GraniteConfig(
            **SMALL,
            logits_scaling=4.0,
            embedding_multiplier=2.0,
            residual_multiplier=0.5,
            attention_multiplier=0.3,
        ),
        "embedding, residual, attention and logit multipliers",
    ),
    Family("olmo2", lambda: tf.Olmo2Config(**SMALL), "post-norms, q/k norms over all heads"),
    Family(
        "gemma", lambda: tf.GemmaConfig(**SMALL, head_dim=8), "scaled embeddings, (1 + w) norms"
    ),
    Family(
        "gemma2",
        lambda: tf.Gemma2Config(
            **SMALL,
            head_dim=8,
            sliding_window=WINDOW,
            attn_logit_softcapping=0.5,
            final_logit_softcapping=2.0,
            query_pre_attn_scalar=12,
        ),
        "attention and final-logit soft-capping, alternating sliding layers, query_pre_attn_scalar",
    ),
    Family(
        "gemma3_text",
        lambda: tf.Gemma3TextConfig(
            **SMALL,
            head_dim=8,
            sliding_window=WINDOW,
            query_pre_attn_scalar=12,
            layer_types=_layers("sliding_attention", "full_attention"),
        ),
        "scaled embeddings, q/k norms, sliding and global layers with two RoPE bases",
    ),
    Family(
        "gpt_oss",
        lambda: tf.GptOssConfig(
            **{**SMALL, "num_key_value_heads": 2},
            head_dim=8,
            num_local_experts=4,
            **MOE,
            sliding_window=WINDOW,
        ),
        "attention sinks, alternating sliding layers, biased experts with clamped SwiGLU, router",
    ),
    # Kept alike on purpose: one entry per family, each its own config class and sizes.
    Family(
        "mixtral",
        lambda: tf.MixtralConfig(**SMALL, num_local_experts=4, **MOE),
        "top-2 of 4 experts, router load-balancing loss",
    ),
    Family(
        "qwen3_moe",
        lambda: tf.Qwen3MoeConfig(
            **SMALL,
            head_dim=8,
            num_experts=4,
            moe_intermediate_size=16,
            **MOE,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        ),
        "q/k norms, 4 experts, router load-balancing loss",
    ),
    Family(
        "deepseek_v3",
        lambda: tf.DeepseekV3Config(
            **{**SMALL, "num_key_value_heads": 4},
            n_routed_experts=4,
            n_shared_experts=1,
            moe_intermediate_size=16,
            **MOE,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            q_lora_rank=16,
            kv_lora_rank=8,
            qk_rope_head_dim=4,
            qk_nope_head_dim=8,
            v_head_dim=6,
        ),
        "MLA attention (low-rank q and kv, v head dim apart), shared expert, a dense first layer",
    ),
    Family(
        "granitemoe",
        lambda: tf.GraniteMoeConfig(
            **SMALL, num_local_experts=4, **MOE, logits_scaling=4.0, embedding_multiplier=2.0
        ),
        "4 experts with fused input_linear, Granite's multipliers",
    ),
]
BY_NAME = {family.name: family for family in FAMILIES}


RTOL = 1e-5
"""Relative error allowed, tensor by tensor (fp32 rounding of sums taken in another order)."""
LENGTHS = [9, 3, 14, 6]
"""Samples of a packed row: two longer than every window, one shorter."""


def build_model(name: str, **overrides):
    """The family's tiny model, eager attention, fp32, seeded (the same on every rank);
    `overrides` set config fields first."""
    torch.manual_seed(0)
    config = BY_NAME[name].build()
    for key, value in overrides.items():
        setattr(config, key, value)
    config._attn_implementation = "eager"
    return tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).train()


def samples(vocab: int, lengths=LENGTHS) -> list[dict]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for n in lengths:
        ids = torch.randint(3, vocab, (n,), generator=gen).tolist()
        labels = [-100 if i < 2 else t for i, t in enumerate(ids)]
        out.append({"input_ids": ids, "labels": labels})
    return out


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """|got - want| / |want| in the Frobenius norm: one number per tensor, so an element that
    is a sum of cancelling terms (near zero) does not dominate."""
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def eager_reference(model, batch):
    """Summed token loss of each sample run alone by transformers (eager attention), and the
    gradients of that sum."""
    model.zero_grad(set_to_none=True)
    total = 0.0
    for sample in batch:
        ids = torch.tensor([sample["input_ids"]])
        labels = torch.tensor([sample["labels"]])
        n = int((labels[0, 1:] != -100).sum())
        out = model(input_ids=ids, labels=labels, use_cache=False)
        total = total + out.loss * n
    total.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return total.detach(), grads


def sharded_step(folder, batch, runtime, router=None):
    """Our side of one step on this rank's `batch`: the FSDP2 model built from `folder` by
    the engine's own `build_model` (loader, layouts, attention choice), one packed row, the
    chunked loss. Returns (wrapped model, summed loss of this rank's tokens); gradients are
    left in the model (FSDP2 averages them over the ranks). `router`: a `RouterStats` that
    records a mixture of experts' routing and adds its aux term, as the training loop does."""
    # deferred: the engine's modules are only needed where a step runs
    from mini_trainer.batching.collator import collate_packed
    from mini_trainer.method import FullFineTuning
    from mini_trainer.training import attention
    from mini_trainer.training.loss import chunked_linear_cross_entropy
    from mini_trainer.training.model_setup import ModelSpec
    from mini_trainer.training.model_setup import build_model as build_sharded

    spec = ModelSpec(str(folder))
    wrapped, _ = build_sharded(spec, chunked_linear_cross_entropy, runtime, FullFineTuning())
    wrapped.train()
    name = wrapped.model.config._attn_implementation
    micro = collate_packed(batch, batch_num_loss_tokens=1)
    loss = wrapped(
        micro.input_ids, micro.position_ids, micro.target_ids, loss_rows=micro.loss_rows,
        router=router, **attention.attention_kwargs(name, micro),
    )  # fmt: skip
    loss.backward()
    return wrapped, loss.detach()


def full_grads(wrapped, world_size: int) -> dict[str, torch.Tensor]:
    """The summed (not averaged) gradient of every parameter, whole, by Hugging Face name."""
    return {
        key.removeprefix("model."): p.grad.full_tensor() * world_size
        for key, p in wrapped.named_parameters()
        if p.grad is not None
    }


def worst_errors(got: dict, want: dict, shown: int = 3) -> list[tuple[str, float]]:
    """The largest relative errors, tensor by tensor; a missing or extra gradient is inf."""
    errors = {key: relative_error(got[key], want[key]) if key in got else float("inf")
              for key in want}  # fmt: skip
    errors.update({key: float("inf") for key in set(got) - set(want)})
    return sorted(errors.items(), key=lambda kv: -kv[1])[:shown]


FP4_VALUES = [
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
]


def mxfp4_quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 as gpt-oss checkpoints store it, along the last dimension: (blocks [..., n/32, 16]
    uint8, two 4-bit codes per byte, the even element in the low nibble; scales [..., n/32]
    uint8, a power-of-two exponent + 127 per 32 values). Round to nearest; a test's stand-in
    for OpenAI's quantizer (which needs triton)."""
    groups = weight.float().reshape(*weight.shape[:-1], -1, 32)
    largest = groups.abs().amax(-1, keepdim=True).clamp_min(2.0**-100)
    exponent = torch.floor(torch.log2(largest)) - 2  # the largest maps into [4, 8): 6 and up
    codes = (groups / 2.0**exponent).unsqueeze(-1) - torch.tensor(FP4_VALUES)
    codes = codes.abs().argmin(-1)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return blocks, (exponent.squeeze(-1) + 127).to(torch.uint8)
