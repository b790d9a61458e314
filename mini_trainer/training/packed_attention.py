"""Attention for packed rows that costs sum(len_i^2), not (sum len_i)^2.

Hugging Face's sdpa and eager paths isolate packed sequences with a block-diagonal T x T mask,
so a row of many short samples pays attention over the whole row, then throws most of it away.
This implementation finds each sample's span from the position ids (which restart at 0 per
sample) and runs causal `scaled_dot_product_attention` on each span alone: exact, no mask
tensor, and the cost of the samples themselves. It is the CPU path and the fallback on CUDA
without flash-attention (whose varlen kernel does the same in one launch).

Every attention feature of the supported families is applied per sample, as the families' own
eager attention applies it: a sliding window (Mistral, Gemma 2/3, gpt-oss; query i sees keys
i - window < j <= i), logit soft-capping (Gemma 2: `softcap * tanh(scores / softcap)` before
the mask) and attention sinks (gpt-oss: one learned logit per head that joins every softmax's
denominator and is then dropped). sdpa has no soft-cap or sink, so a layer that has either
runs the explicit formula (`explicit_attention`); every other layer stays on sdpa.

The name carries no "sdpa": transformers refuses any implementation whose name contains it for
families that declare no sdpa support (Gemma 2, gpt-oss), whatever the function does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

NAME = "mini_trainer_packed"


def segment_bounds(position_ids: torch.Tensor) -> list[int]:
    """[0, s1, s2, ..., T]: where each packed sample starts in one row of position ids."""
    starts = torch.nonzero(position_ids == 0).flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return [*starts, position_ids.numel()]


def packed_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Hugging Face attention-interface signature; q/k/v are (batch, heads, tokens, head_dim)."""
    position_ids = kwargs.get("position_ids")
    gqa = query.shape[1] != key.shape[1]
    dropout_p = dropout if module.training else 0.0
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")  # Gemma 2; gpt-oss
    if attention_mask is not None or position_ids is None:  # padded or plain input
        mask = _causal_padding_mask(attention_mask, query.shape[2], key.shape[2], query.device)
        if softcap is not None or sinks is not None or kwargs.get("sliding_window") is not None:
            allowed = window_mask(query.shape[2], kwargs.get("sliding_window"), query.device,
                                   always=True)  # fmt: skip
            allowed = allowed if mask is None else mask & allowed
            output = explicit_attention(
                query, key, value, allowed, scaling, softcap, sinks, dropout_p
            )
            return output.transpose(1, 2).contiguous(), None
        output = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout_p,
            is_causal=mask is None, scale=scaling, enable_gqa=gqa,
        )  # fmt: skip
        return output.transpose(1, 2).contiguous(), None
    known_bounds = kwargs.get("packed_bounds")  # computed once per forward by the caller
    window = kwargs.get("sliding_window")  # a layer with local attention (Mistral, Gemma)
    rows = []
    for row, (q_row, k_row, v_row) in enumerate(
        zip(query.split(1), key.split(1), value.split(1), strict=True)
    ):
        bounds = known_bounds[row] if known_bounds else segment_bounds(position_ids[row])
        sizes = [end - start for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
        # split, not one slice per sample: a slice's backward writes its gradient into a
        # zero-filled tensor of the whole row, so n samples cost n row-sized fills and adds per
        # layer; split's backward is one concatenation.
        pieces = []
        for q, k, v in zip(q_row.split(sizes, 2), k_row.split(sizes, 2), v_row.split(sizes, 2),
                           strict=True):  # fmt: skip
            # Causal, and within the window if the sample is longer than it (as transformers'
            # mask: query i sees keys j with i - window < j <= i).
            if softcap is not None or sinks is not None:
                band = window_mask(q.shape[2], window, query.device, always=True)
                pieces.append(explicit_attention(q, k, v, band, scaling, softcap, sinks, dropout_p))
                continue
            band = window_mask(q.shape[2], window, query.device)
            pieces.append(
                F.scaled_dot_product_attention(
                    q,
                    k,
                    v,
                    attn_mask=band,
                    dropout_p=dropout_p,
                    is_causal=band is None,
                    scale=scaling,
                    enable_gqa=gqa,
                )  # fmt: skip
            )
        rows.append(torch.cat(pieces, dim=2) if len(pieces) > 1 else pieces[0])
    output = torch.cat(rows, dim=0) if len(rows) > 1 else rows[0]
    return output.transpose(1, 2).contiguous(), None


def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    scaling: float | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Attention of one sample written out, for what sdpa lacks: soft-capped scores and sinks.

    q (B, H, L, D), k (B, Hkv, L, D), v (B, Hkv, L, Dv); `allowed` boolean, broadcastable to
    (B, H, L, L) (causal, the window, padding). The order is the families' own: scale,
    soft-cap, mask, then a softmax whose denominator also holds each head's sink logit
    (subtracting the row maximum first, as gpt-oss does, so large sinks do not overflow).
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scale = q.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    else:
        sink = sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[2], 1).to(scores.dtype)
        combined = torch.cat([scores, sink], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1].to(q.dtype)
    if dropout_p > 0:
        probs = F.dropout(probs, p=dropout_p)
    return torch.matmul(probs, v)


def window_mask(
    length: int, window: int | None, device, always: bool = False
) -> torch.Tensor | None:
    """(length, length) causal sliding-window mask; None when the window covers the sample
    (plain causal, which sdpa's `is_causal` gives), unless `always`."""
    if (window is None or length <= window) and not always:
        return None
    positions = torch.arange(length, device=device)
    offset = positions[:, None] - positions[None, :]
    if window is None:
        return offset >= 0
    return (offset >= 0) & (offset < window)


def _causal_padding_mask(padding_mask, q_len: int, kv_len: int, device) -> torch.Tensor | None:
    """(batch, 1, q, kv) boolean mask from a 2-D padding mask; None when nothing is padded.

    A query that may see no key at all (left padding) is let see itself, so it yields a value
    instead of NaN; such positions are padding and are never read.
    """
    if padding_mask is None:
        return None
    if padding_mask.dim() == 4:  # already a full mask
        return padding_mask.bool()
    causal = torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(kv_len - q_len)
    mask = causal[None, None] & padding_mask[:, None, None, -kv_len:].bool()
    return mask | torch.eye(q_len, kv_len, dtype=torch.bool, device=device)[None, None]


def register() -> str:
    """Make `NAME` a valid `attn_implementation` (idempotent); return the name.

    Its mask function is flash-attention's, which builds no T x T mask for unpadded input.
    """
    AttentionInterface.register(NAME, packed_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, flash_attention_mask)
    return NAME
