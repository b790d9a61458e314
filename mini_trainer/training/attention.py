"""Which attention kernel packed rows use, chosen once per run, and what each one is handed.

Three paths, each isolating the samples of a packed row and costing the samples' own attention:

| path | where | launches per layer |
| --- | --- | --- |
| `flash_attention_2` (transformers + the flash-attn package) | CUDA, when flash-attn imports | 1 |
| `VARLEN_NAME`: torch's native `torch.nn.attention.varlen.varlen_attn` | CUDA, torch >= 2.10 | 1 |
| `packed_attention.NAME`: causal sdpa on each sample | CPU (and CUDA without either) | samples |

`choose_attention` is the pure decision (tested on CPU); `pick_attention` is the one device check
that feeds it. The model's attention may ask for more than plain causal attention
(`attention_needs`: sliding windows, soft-capped scores, sinks, a value head size apart from the
query's); a kernel is chosen only if it does all the model asks, so every family is exact on
every device:

| need | per-sample | flash-attn 2 | torch varlen |
| --- | --- | --- | --- |
| sliding window (Mistral, Gemma 2/3, gpt-oss) | yes | yes | yes |
| score soft-capping (Gemma 2) | yes | yes | no |
| sinks (gpt-oss) | yes | no (dropped silently) | no |
| value head size apart (DeepSeek-V3's MLA) | yes | no | no |
 Sample boundaries come from the collator, which knows them on the host: the
per-sample path gets them as a Python list, the varlen kernels as a `cu_seqlens` tensor plus an
int maximum, so no path reads boundaries back from the device (`nonzero().tolist()`, `.item()`).

The varlen path is registered WITHOUT a mask function, so transformers' `create_causal_mask`
returns at once (no packed-sequence detection, which ends in a host sync); the layout code
around the kernel (`varlen_attention`) is shared with a CPU reference kernel that the tests run.
transformers' own flash path keeps that detection (one small sync per forward, not per layer);
given the boundaries it skips its per-layer search from the position ids.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from mini_trainer.training import context_attention, packed_attention

log = logging.getLogger("mini_trainer")

FLASH_NAME = "flash_attention_2"
VARLEN_NAME = "mini_trainer_varlen"
PER_SAMPLE_NAME = packed_attention.NAME

VarlenKernel = Callable[..., torch.Tensor]
"""kernel(q, k, v, cu_seqlens, max_seqlen, scale, enable_gqa, window) -> out; q/k/v/out
(T, H, D); `window` None, or the sliding window (query i sees keys i - window < j <= i)."""


WINDOW, SOFTCAP, SINKS, VALUE_DIM = "sliding window", "soft-capping", "sinks", "value head size"
KERNEL_SUPPORTS = {
    FLASH_NAME: frozenset({WINDOW, SOFTCAP}),
    VARLEN_NAME: frozenset({WINDOW}),
}
"""What each one-launch kernel does beyond causal attention; the per-sample path does all."""


def attention_needs(model: torch.nn.Module) -> frozenset[str]:
    """What the model's attention layers ask beyond plain causal attention, read off the
    layers themselves (meta device is fine): the attributes each family's attention keeps."""
    needs = set()
    for module in model.modules():
        if hasattr(module, "o_proj") and hasattr(module, "config"):  # an attention layer
            # its own window (Qwen2, Gemma, gpt-oss), or its config's (Mistral, Mixtral)
            window = getattr(
                module, "sliding_window", getattr(module.config, "sliding_window", None)
            )
            if window is not None:
                needs.add(WINDOW)
        if getattr(module, "attn_logit_softcapping", None) is not None:
            needs.add(SOFTCAP)
        if isinstance(getattr(module, "sinks", None), torch.Tensor):
            needs.add(SINKS)
        v_dim, qk_dim = getattr(module, "v_head_dim", None), getattr(module, "qk_head_dim", None)
        if v_dim is not None and qk_dim is not None and v_dim != qk_dim:
            needs.add(VALUE_DIM)
    return frozenset(needs)


def choose_attention(
    is_cuda: bool,
    flash_available: bool,
    varlen_available: bool,
    needs: frozenset[str] = frozenset(),
) -> str:
    """The attention for packed training rows: a pure function of what the machine offers and
    what the model's attention needs."""
    if is_cuda and flash_available and needs <= KERNEL_SUPPORTS[FLASH_NAME]:
        return FLASH_NAME
    if is_cuda and varlen_available and needs <= KERNEL_SUPPORTS[VARLEN_NAME]:
        return VARLEN_NAME
    return PER_SAMPLE_NAME


def flash_attn_imports() -> tuple[bool, str]:
    """Whether the flash-attn package imports, and why not."""
    try:
        # deferred: optional (flash-attn may be absent, or built for another torch)
        import flash_attn  # noqa: F401
    except (ImportError, OSError, RuntimeError) as error:  # e.g. built for another torch
        return False, str(error)
    return True, ""


def torch_varlen_available() -> bool:
    """Whether this torch ships `torch.nn.attention.varlen.varlen_attn` (2.10 and later)."""
    try:
        # deferred: optional (torch 2.10 and later; see torch_varlen_available)
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def pick_attention(runtime, needs: frozenset[str] = frozenset()) -> str:
    """The one device check behind the attention choice; registers the chosen implementation."""
    flash, why_not = flash_attn_imports() if runtime.is_cuda else (False, "")
    if runtime.is_cuda and not flash and runtime.is_main:
        log.warning("flash-attn does not import (%s)", why_not)
    varlen = runtime.is_cuda and torch_varlen_available()
    name = choose_attention(runtime.is_cuda, flash, varlen, needs)
    if runtime.is_cuda and name == PER_SAMPLE_NAME and (flash or varlen) and runtime.is_main:
        log.info("per-sample attention: the model's attention needs %s", ", ".join(sorted(needs)))
    register(name)
    return name


def register(name: str) -> str:
    """Make `name` a valid `attn_implementation` (idempotent)."""
    if name == PER_SAMPLE_NAME:
        return packed_attention.register()
    if name == VARLEN_NAME:
        register_varlen(VARLEN_NAME, torch_varlen_kernel)
    return name


def register_varlen(name: str, kernel: VarlenKernel) -> str:
    """Register `varlen_attention` with `kernel` under `name`, with no mask function."""

    def attention(module, query, key, value, attention_mask, **kwargs):
        return varlen_attention(module, query, key, value, attention_mask, kernel=kernel, **kwargs)

    AttentionInterface.register(name, attention)
    return name


def attention_kwargs(name: str, micro) -> dict:
    """What the decoder passes down to every attention call for packed micro-batch `micro`.

    `micro` is a `PackedMicroBatch` whose tensors are already on the device; its `seq_starts`
    list is host memory. transformers' flash path takes the same `cu_seq_lens_*`/`max_length_*`
    names, so it skips its own per-layer boundary search.
    """
    if name == PER_SAMPLE_NAME:
        return {"packed_bounds": [micro.seq_starts]}
    if name == context_attention.NAME:  # a context-parallel chunk (batching/context_split.py)
        return {"context_layout": micro.context}
    return {
        "cu_seq_lens_q": micro.cu_seqlens,
        "cu_seq_lens_k": micro.cu_seqlens,
        "max_length_q": micro.max_seqlen,
        "max_length_k": micro.max_seqlen,
    }


# Kept alike on purpose: the attention-function signature transformers calls (as
# packed_attention.packed_sdpa_attention's); each registered kernel spells it out.
def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    *,
    kernel: VarlenKernel,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Hugging Face attention-interface signature; q/k/v are (batch, heads, tokens, head_dim).

    The batch's rows are one token stream cut by `cu_seq_lens_q` (from the collator), so one
    kernel call covers every sample of every row.
    """
    cu_seqlens, max_seqlen = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    if cu_seqlens is None or max_seqlen is None:
        raise ValueError(
            "varlen attention needs cu_seq_lens_q and max_length_q from the packed collator"
        )
    if attention_mask is not None:
        raise ValueError("varlen attention takes packed rows, not a padding mask")
    if module.training and dropout > 0:
        raise ValueError("varlen attention has no attention dropout; set attention_dropout=0")
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        # choose_attention never picks this path for such a model (KERNEL_SUPPORTS)
        raise ValueError("varlen attention: no soft-capping or sinks; use the per-sample path")
    batch, _, tokens, _ = query.shape
    # (B, H, T, D) -> (B*T, H, D): the rows laid end to end, as cu_seqlens counts them.
    q, k, v = (
        x.transpose(1, 2).reshape(batch * tokens, x.shape[1], x.shape[3])
        for x in (query, key, value)
    )
    window = kwargs.get("sliding_window")
    gqa = query.shape[1] != key.shape[1]
    out = kernel(q, k, v, cu_seqlens, int(max_seqlen), scaling, gqa, window)
    return out.reshape(batch, tokens, out.shape[1], out.shape[2]), None


def torch_varlen_kernel(q, k, v, cu_seqlens, max_seqlen, scale, enable_gqa, window=None):
    """torch's native varlen kernel (CUDA, bf16/fp16); causal is the window (-1, 0), a sliding
    window of W tokens (W - 1, 0) (inclusive bounds: W - 1 keys back and the query's own)."""
    # deferred: optional (torch 2.10 and later; see torch_varlen_available)
    from torch.nn.attention.varlen import varlen_attn

    cu = cu_seqlens.to(torch.int32)
    return varlen_attn(
        q, k, v, cu, cu, max_seqlen, max_seqlen,
        scale=scale, window_size=(-1 if window is None else window - 1, 0), enable_gqa=enable_gqa,
    )  # fmt: skip


def reference_varlen_kernel(q, k, v, cu_seqlens, max_seqlen, scale, enable_gqa, window=None):
    """The varlen contract in plain sdpa, one sample at a time: runs anywhere, for tests."""
    bounds = cu_seqlens.tolist()
    pieces = [
        F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1),
            k[start:end].transpose(0, 1),
            v[start:end].transpose(0, 1),
            attn_mask=packed_attention.window_mask(end - start, window, q.device, always=True),
            scale=scale,
            enable_gqa=enable_gqa,
        ).transpose(0, 1)
        for start, end in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    if max(end - start for start, end in zip(bounds[:-1], bounds[1:], strict=True)) != max_seqlen:
        raise ValueError(f"max_seqlen {max_seqlen} does not match cu_seqlens {bounds}")
    return torch.cat(pieces, dim=0)
