"""Tiny random models of every supported family, built from transformers' own config classes.

Each entry sets the features that family trains with to values that matter in a 2-layer,
32-wide model on samples of up to ~16 tokens: windows shorter than the samples, soft-caps small
enough to bend the logits, several experts with top-2 routing. Shared by the family tests and
docs/training.md's supported-families table (`scripts/families_table.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
