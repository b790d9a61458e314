"""Attention of one context-parallel chunk: gather the group's keys and values, mask per document.

Each rank of a group holds a zig-zag chunk of the row (batching/context_split.py). In every
attention layer it all-gathers the group's keys and values (one collective: keys and values
concatenated), puts them back in row order (`row_from_chunks`) and runs each of its query
blocks (one per document and piece, `ChunkLayout.segments`) against exactly the keys that
block sees on one GPU: its document's, up to its own last position (and within the sliding
window). A document that crosses a chunk boundary therefore attends exactly as unsplit.

All-gather rather than a ring (ring attention passes key/value blocks around and merges partial
softmaxes by their log-sum-exp):
- exact and simple: each query block is one ordinary attention call over its true key set, the
  same sdpa or `explicit_attention` (soft-caps, sinks, windows) as the per-sample path, so every
  family the packed path supports is supported here; no partial-softmax merge, which neither
  sdpa on the CPU nor the explicit formula exposes.
- gloo runs it: the gather (`GatherChunks`) is autograd-aware, its backward sums each rank's
  key/value gradients back to their owner (a reduce-scatter on NCCL; on gloo, which has none,
  an all-reduce of which each rank keeps its part), so key and value gradients flow exactly.
- its cost is memory: every rank holds the whole row's keys and values for the layer it runs
  (and, without activation checkpointing, keeps them for backward in every layer). `plan`
  counts this buffer; at 8B (8 KV heads x 128) it is 4 KiB per token per layer in bf16, 512 MiB
  for a 131,072-token row, beside the activations of a chunk. A ring would keep 2/N of it; it
  is the next step if the gathered buffer, not the chunk's activations, is what limits.
- communication is N times a chunk's keys and values per layer, the same volume a ring sends,
  but not overlapped with compute.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from transformers import AttentionInterface

from mini_trainer.batching.context_split import ChunkLayout, Segment, row_from_chunks
from mini_trainer.training.packed_attention import explicit_attention

NAME = "mini_trainer_context_parallel"


class GatherChunks(torch.autograd.Function):
    """All-gather of one tensor per rank of `group` into (N, *shape); the backward hands each
    rank the sum over the group of the gradients of its own chunk (a reduce-scatter).

    Not `torch.distributed.nn.functional.all_gather`: its gloo backward (an all-to-all built
    from `scatter` calls) passes group ranks where global ranks are meant, and fails in any
    group that does not start at global rank 0 (dp x cp with dp > 1)."""

    @staticmethod
    def forward(ctx, chunk: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        size = dist.get_world_size(group)
        out = chunk.new_empty((size * chunk.shape[0], *chunk.shape[1:]))  # chunks along dim 0
        dist.all_gather_into_tensor(out, chunk.contiguous(), group=group)
        return out.view(size, *chunk.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        rank = dist.get_rank(ctx.group)
        if dist.get_backend(ctx.group) == dist.Backend.NCCL:
            mine = grad.new_empty(grad.shape[1:])
            flat = grad.contiguous().view(-1, *grad.shape[2:])  # chunks along dim 0
            dist.reduce_scatter_tensor(mine, flat, group=ctx.group)
            return mine, None
        summed = grad.contiguous().clone()  # gloo: no reduce-scatter; sum all, keep ours
        dist.all_reduce(summed, group=ctx.group)
        return summed[rank], None


def gather_row(
    key: torch.Tensor, value: torch.Tensor, layout: ChunkLayout, group
) -> tuple[torch.Tensor, torch.Tensor]:
    """The group's keys and values of the whole row, in row order: (1, Hkv, 2NP, D) each.
    Autograd-aware: the backward returns each rank the summed gradients of its own chunk."""
    k_dim = key.shape[-1]
    chunks = GatherChunks.apply(torch.cat([key, value], dim=-1), group)
    row = row_from_chunks(list(chunks.unbind(0)), layout.piece_len)
    return row[..., :k_dim], row[..., k_dim:]


def segment_mask(segment: Segment, window: int | None, device) -> torch.Tensor:
    """(queries, keys) boolean: query q_global + i sees key k_start + j when it is not later
    and, with a window W, fewer than W positions earlier."""
    queries = torch.arange(segment.q_end - segment.q_start, device=device) + segment.q_global
    keys = torch.arange(segment.k_end - segment.k_start, device=device) + segment.k_start
    offset = queries[:, None] - keys[None, :]
    return (offset >= 0) if window is None else (offset >= 0) & (offset < window)


def chunk_attention(
    query: torch.Tensor,
    key_row: torch.Tensor,
    value_row: torch.Tensor,
    layout: ChunkLayout,
    *,
    scaling: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """The chunk's attention output (1, H, 2P, Dv) from its queries (1, H, 2P, D) and the
    whole row's keys and values (1, Hkv, 2NP, D): one call per `segment`. A block whose keys
    start at its first query (a document's first block, no window) is plain causal; one that
    sees earlier keys is causal aligned to its last key (`causal_lower_right`, no mask
    tensor); a window or soft-cap/sink needs the explicit mask."""
    gqa = query.shape[1] != key_row.shape[1]
    segments = layout.segments(window)
    sizes = [s.q_end - s.q_start for s in segments]
    pieces = []
    for q, segment in zip(query.split(sizes, 2), segments, strict=True):
        k = key_row[:, :, segment.k_start : segment.k_end]
        v = value_row[:, :, segment.k_start : segment.k_end]
        q_len, k_len = q.shape[2], k.shape[2]
        banded = window is not None and q_len + segment.q_global - segment.k_start > window
        if softcap is not None or sinks is not None:
            allowed = segment_mask(segment, window, query.device)
            pieces.append(explicit_attention(q, k, v, allowed, scaling, softcap, sinks, dropout_p))
            continue
        if banded:
            mask = segment_mask(segment, window, query.device)
        else:
            mask = None if q_len == k_len else causal_lower_right(q_len, k_len)
        pieces.append(
            F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=dropout_p,
                is_causal=mask is None,
                scale=scaling,
                enable_gqa=gqa,
            )  # fmt: skip
        )
    return torch.cat(pieces, dim=2) if len(pieces) > 1 else pieces[0]


def register(group, name: str = NAME) -> str:
    """Register context-parallel attention over process group `group` (the rank's CP group)
    as `attn_implementation` `name`, with no mask function (so transformers builds no mask
    and looks for no packed sequences: a chunk's position ids do not restart at 0)."""

    # Kept alike on purpose: the attention-function signature transformers calls (as
    # packed_attention.packed_sdpa_attention's).
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        layout = kwargs.get("context_layout")
        if layout is None:
            raise ValueError("context-parallel attention needs context_layout from split_row")
        if attention_mask is not None or query.shape[0] != 1:
            raise ValueError("context-parallel attention takes one packed row, no padding mask")
        key_row, value_row = gather_row(key, value, layout, group)
        output = chunk_attention(
            query, key_row, value_row, layout, scaling=scaling,
            window=kwargs.get("sliding_window"), softcap=kwargs.get("softcap"),
            sinks=kwargs.get("s_aux"), dropout_p=dropout if module.training else 0.0,
        )  # fmt: skip
        return output.transpose(1, 2).contiguous(), None

    AttentionInterface.register(name, attention)
    return name
