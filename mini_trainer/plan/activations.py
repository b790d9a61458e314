"""Activation memory of one packed row, traced from the real decoder on meta tensors.

The model's own forward runs on the meta device (shapes and dtypes only, no memory, no compute)
under `saved_tensors_hooks`, and every tensor autograd keeps for the backward is counted once
per storage, parameters excluded: that is the activation memory of the row, as the code makes
it (norms that upcast to fp32, OSFT's saved input, the MLP's intermediates...).

Attention is the one part that cannot run as on the device: the kernels are CUDA (flash, torch
varlen) or choose their algorithm from the device (CPU sdpa), and transformers' packed-sequence
detection reads position ids back (`.item()`, impossible on meta). So the trace runs the real
layout code of the varlen path (`attention.varlen_attention`) with a stand-in kernel that saves
what flash-style kernels save: q, k, v, the output and a fp32 log-sum-exp per head and token.
On the CPU path (per-sample sdpa) the kernel saves the same; its q, k, v are not copied first.
A layer with soft-capped scores or sinks on the per-sample path (the CPU, and on CUDA where no
kernel does what it needs: `attention.choose_attention`) runs the real explicit formula
(`packed_attention.explicit_attention`) on meta tensors, so its tokens x tokens scores and
probabilities per head are counted, for one sample as long as the row (the worst case).

Only the first decoder layer is traced when every layer has the same parameter shapes (then
they save the same), and multiplied by the layer count: the trace of a 70B model takes a
fraction of a second instead of several.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations import moe as moe_integration

from mini_trainer.training.attention import (
    PER_SAMPLE_NAME,
    attention_needs,
    choose_attention,
    varlen_attention,
)
from mini_trainer.training.packed_attention import explicit_attention, window_mask

NAME_CUDA = "mini_trainer_plan_varlen"
NAME_CPU = "mini_trainer_plan_cpu"


class _FlashLikeAttention(torch.autograd.Function):
    """Saves (q, k, v, out, lse) as flash-style kernels do; meta tensors only."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))  # MLA: the value head size differs
        lse = q.new_empty((q.shape[-2], q.shape[0]), dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):  # never run: the trace has no backward
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _kernel(q, k, v, cu_seqlens, max_seqlen, scale, enable_gqa, window=None):
    return _FlashLikeAttention.apply(q, k, v)


def _cpu_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kw):
    """The per-sample path's shape of work: flash-style sdpa on (B, H, T, D), output made
    contiguous; the explicit formula where the layer soft-caps its scores or has sinks."""
    if kw.get("softcap") is not None or kw.get("s_aux") is not None:
        allowed = window_mask(query.shape[2], kw.get("sliding_window"), query.device, always=True)
        out = explicit_attention(
            query, key, value, allowed, scaling, kw.get("softcap"), kw.get("s_aux")
        )
    else:
        out = _FlashLikeAttention.apply(query, key, value)
    return out.transpose(1, 2).contiguous(), None


def _cuda_attention(module, query, key, value, attention_mask, **kw):
    """The one-launch kernels' layout code; flash-attn's soft-cap costs no memory of its own."""
    kw.pop("softcap", None)
    return varlen_attention(module, query, key, value, attention_mask, kernel=_kernel, **kw)


def register() -> None:
    AttentionInterface.register(NAME_CUDA, _cuda_attention)
    AttentionInterface.register(NAME_CPU, _cpu_attention)


@dataclass(frozen=True)
class Trace:
    """Bytes autograd keeps for one row of `tokens` tokens (forward, no checkpointing)."""

    tokens: int
    layer_bytes: int
    """Saved by one decoder layer."""
    layer_input_bytes: int
    """One layer's input hidden state: what a checkpointed layer keeps."""
    outside_bytes: int
    """Saved outside the layers (embedding, rotary tables, final norm)."""
    layers: int
    traced_layers: int

    def saved(self, checkpointing: bool) -> int:
        """Bytes held at the end of the forward."""
        per_layer = self.layer_input_bytes if checkpointing else self.layer_bytes
        return self.outside_bytes + self.layers * per_layer

    def per_token(self, checkpointing: bool) -> float:
        return self.saved(checkpointing) / self.tokens


def trace(wrapped: nn.Module, tokens: int, compute_dtype: torch.dtype, cuda: bool) -> Trace:
    """Trace the decoder of the meta model `wrapped` on one packed row of `tokens` tokens."""
    register()
    model = wrapped.model
    decoder = model.get_decoder()
    layers = decoder.layers
    uniform = (
        len({tuple((n, tuple(p.shape)) for n, p in layer.named_parameters()) for layer in layers})
        == 1
    )
    traced = 1 if uniform else len(layers)
    config = model.config
    saved_attention = config._attn_implementation
    saved_checkpointing = [getattr(layer, "gradient_checkpointing", False) for layer in layers]
    # the path training takes on this device, a GPU with flash-attn assumed
    per_sample = choose_attention(cuda, True, True, attention_needs(model)) == PER_SAMPLE_NAME
    config._attn_implementation = NAME_CPU if per_sample else NAME_CUDA
    # grouped_mm has no fp32 meta kernel: a mixture of experts' fp32 (CPU) run is traced
    # through transformers' own fallback op (its fake kernel; it saves what grouped_mm saves)
    grouped_mm_check = moe_integration._can_use_grouped_mm
    if compute_dtype != torch.bfloat16:
        moe_integration._can_use_grouped_mm = lambda *args: False
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    per_layer: dict[int, dict[int, int]] = {}
    current = [-1]
    outside: dict[int, int] = {}
    inputs: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in params:
            target = outside if current[0] < 0 else per_layer.setdefault(current[0], {})
            target[key] = storage.nbytes()
        return tensor

    def enter(index):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            inputs[index] = hidden.untyped_storage().nbytes()
            current[0] = index

        return hook

    def leave(module, args, kwargs, output):
        current[0] = -1

    handles = []
    original = decoder.layers
    try:
        decoder.layers = nn.ModuleList(list(layers)[:traced])
        for index, layer in enumerate(decoder.layers):
            layer.gradient_checkpointing = False
            handles.append(layer.register_forward_pre_hook(enter(index), with_kwargs=True))
            handles.append(layer.register_forward_hook(leave, with_kwargs=True))
        if compute_dtype != torch.float32:
            model.to(compute_dtype)
            params = {p.untyped_storage()._cdata for p in model.parameters()}
        ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
        positions = torch.zeros(1, tokens, dtype=torch.long, device="meta")
        cu = torch.zeros(2, dtype=torch.int32, device="meta")
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            hidden = decoder(
                input_ids=ids,
                position_ids=positions,
                use_cache=False,
                packed_bounds=[[0, tokens]],
                cu_seq_lens_q=cu,
                cu_seq_lens_k=cu,
                max_length_q=tokens,
                max_length_k=tokens,
            ).last_hidden_state
        outside[-1] = hidden.untyped_storage().nbytes()  # the loss's input
    finally:
        for handle in handles:
            handle.remove()
        decoder.layers = original
        config._attn_implementation = saved_attention
        moe_integration._can_use_grouped_mm = grouped_mm_check
        for layer, flag in zip(layers, saved_checkpointing, strict=True):
            layer.gradient_checkpointing = flag
        if compute_dtype != torch.float32:
            model.to(torch.float32)
    layer_totals = [sum(per_layer.get(i, {}).values()) for i in range(traced)]
    return Trace(
        tokens=tokens,
        layer_bytes=max(layer_totals),
        layer_input_bytes=max(inputs.values()),
        outside_bytes=sum(outside.values()),
        layers=len(layers),
        traced_layers=traced,
    )
