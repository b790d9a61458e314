"""Token cross-entropy over the LM head without materializing the full tokens x vocabulary logits.

The loss is returned as a SUM over loss tokens: the engine divides by the loss-token count of the
whole global batch (all micro-batches, all ranks), so one step equals one big batch however it is
split. A per-micro-batch mean would weight tokens unequally.

Two implementations sit behind `make_loss_fn`:
- `chunked_linear_cross_entropy`: plain torch, any device. Its forward walks the loss tokens in
  chunks, computes each chunk's logits, loss and gradients at once (the approach of Liger's fused
  linear cross-entropy) and keeps only grad_hidden (N x H) and grad_weight (V x H); logits never
  exist for more than one chunk.
- Liger's Triton `LigerFusedLinearCrossEntropyLoss` with `--use-liger-kernels` (CUDA only).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mini_trainer.errors import UserError
from mini_trainer.labels import IGNORE_INDEX

DEFAULT_CHUNK_SIZE = 1024
"""Loss tokens per chunk. A chunk holds one chunk_size x V fp32 buffer (131 MB at V=32,000);
chosen with benchmarks/loss_memory.py (docs/benchmarks.md)."""

LossFn = Callable[..., Tensor]
"""`fn(hidden (N, H), weight (V, H), targets (N,), *, rows, bias, logit_scale, softcap)`:
the loss sum."""


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Sum of token cross-entropies of `hidden @ weight.T`, gradients computed in forward.

    Forward does all the work chunk by chunk and stores the finished gradients; backward only
    scales them by grad_output. This trades keeping N x H + V x H gradients for never keeping
    N x V logits, which for LM vocabularies is the far larger tensor.
    """

    # Kept alike on purpose: the head-loss keywords, as in every loss below.
    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        ignore_index: int,
        chunk_size: int,
        grad_enabled: bool,
        bias: Tensor | None = None,
        logit_scale: float = 1.0,
        softcap: float | None = None,
        rows: Tensor | None = None,
    ) -> Tensor:
        # needs_input_grad ignores no_grad(), so the caller passes whether grad mode was on:
        # evaluation under no_grad must not pay for the gradients.
        need_hidden_grad = grad_enabled and ctx.needs_input_grad[0]
        need_weight_grad = grad_enabled and ctx.needs_input_grad[1]
        need_bias_grad = grad_enabled and bias is not None and ctx.needs_input_grad[6]
        # Only rows with a loss token cost anything: padding-free batches still carry prompt
        # tokens (label -100), often most of the sequence. The caller may know the rows already
        # (the collator builds them on the host): `nonzero` here would wait for the device.
        if rows is None:
            rows = (targets != ignore_index).nonzero().squeeze(1)
        # Softmax in fp32 at least (bf16/fp16 upcast; fp64 stays fp64, for exact tests).
        acc_dtype = torch.promote_types(hidden.dtype, torch.float32)
        loss = torch.zeros((), dtype=acc_dtype, device=hidden.device)
        grad_hidden = torch.zeros_like(hidden) if need_hidden_grad else None
        grad_weight = None
        if need_weight_grad:
            # fp32 accumulation across chunks; for fp32 weights this IS the final gradient.
            grad_weight = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device)
        grad_bias = (
            torch.zeros(bias.shape, dtype=acc_dtype, device=bias.device)
            if (need_bias_grad)
            else None
        )

        for start in range(0, rows.numel(), chunk_size):
            chunk_rows = rows[start : start + chunk_size]
            h = hidden.index_select(0, chunk_rows)  # (c, H), input dtype
            t = targets.index_select(0, chunk_rows).unsqueeze(1)  # (c, 1)
            # Matmul in the input dtype (tensor cores for bf16), softmax in fp32. The softmax is
            # built in place in this one (c, V) buffer: no other chunk-sized temporary exists.
            logits = (h @ weight.T).to(acc_dtype)  # (c, V)
            # The model's own head transform, in its order: bias, scale, soft-cap.
            if bias is not None:
                logits += bias
            if logit_scale != 1.0:
                logits *= logit_scale
            tanh = None
            if softcap is not None:  # cap * tanh(x / cap); tanh kept for the derivative
                tanh = logits.div_(softcap).tanh_()
                logits = tanh * softcap
            target_logit = logits.gather(1, t)
            row_max = logits.amax(dim=1, keepdim=True)
            probs = logits.sub_(row_max).exp_()  # unnormalized; `logits` is consumed
            del logits
            row_sum = probs.sum(dim=1, keepdim=True)
            # loss = logsumexp - target logit = log(sum exp(x - max)) + max - x_t
            loss += (row_sum.log() + row_max - target_logit).sum()
            if need_hidden_grad or need_weight_grad:
                # d(loss)/d(logits) = softmax - onehot
                grad_logits = probs.div_(row_sum)
                grad_logits.scatter_add_(1, t, torch.full_like(row_sum, -1.0))
                # Back through the transform: soft-cap' = 1 - tanh^2, then the scale.
                if tanh is not None:
                    grad_logits.mul_(tanh.mul_(tanh).neg_().add_(1.0))
                if logit_scale != 1.0:
                    grad_logits.mul_(logit_scale)
                if grad_bias is not None:
                    grad_bias += grad_logits.sum(dim=0)
                if grad_hidden is not None:
                    grad_hidden.index_copy_(0, chunk_rows, grad_logits.to(weight.dtype) @ weight)
                if grad_weight is not None:
                    if h.dtype == acc_dtype:
                        grad_weight.addmm_(grad_logits.T, h)
                    else:
                        # Low-precision matmul (fast path on GPU), summed across chunks in fp32.
                        grad_weight.add_(grad_logits.to(h.dtype).T @ h)
                del grad_logits
            # Free this chunk's buffers before the next chunk's matmul allocates its own.
            del probs, tanh

        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        ctx.grads = (grad_hidden, grad_weight, grad_bias)
        return loss

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        if ctx.grads is None:
            raise RuntimeError(
                "chunked_linear_cross_entropy: backward ran twice; its gradients are computed "
                "once in forward and handed over (retain_graph is not supported)"
            )
        grad_hidden, grad_weight, grad_bias = ctx.grads
        # Hand the buffers over and scale them in place: no second V x H tensor, and .grad can
        # adopt the tensor instead of copying it. No test for grad_output == 1 (a device sync):
        # the engine's grad_output is 1 / loss tokens anyway.
        ctx.grads = None
        for grad in (grad_hidden, grad_weight, grad_bias):
            if grad is not None:
                grad.mul_(grad_output.to(grad.dtype))
        return grad_hidden, grad_weight, None, None, None, None, grad_bias, None, None, None


# Kept alike on purpose: the head-loss keywords (bias, logit_scale, softcap, rows) that
# CausalLMWithLoss passes to every loss; each implementation spells them out.
def chunked_linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    ignore_index: int = IGNORE_INDEX,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    bias: Tensor | None = None,
    logit_scale: float = 1.0,
    softcap: float | None = None,
    rows: Tensor | None = None,
) -> Tensor:
    """Sum over targets != ignore_index of cross_entropy(logits, targets), a scalar.

    logits = head(hidden @ weight.T + bias): `logit_scale` multiplies them (Cohere's
    `logit_scale`, Granite's 1 / `logits_scaling`), then `softcap` soft-caps them as
    `softcap * tanh(logits / softcap)` (Gemma's `final_logit_softcapping`), as the models' own
    heads do. A soft-cap costs a second chunk-sized buffer (its derivative needs the tanh).

    hidden (N, H) and weight (V, H) in fp32 or bf16 (the same dtype); targets (N,) integer. The
    softmax and the result are fp32 (fp64 for fp64 inputs).
    Peak extra memory is about chunk_size x V fp32 plus the gradients (N x H, V x H); the full
    N x V logits are never held. Gradients flow to hidden and weight in their own dtypes. With no
    loss token the result is an exact 0 that is still connected to hidden and weight, so backward
    runs and gives zero gradients: under FSDP every rank must run backward (its hooks launch the
    gradient reduce-scatter), so a rank whose micro-batch has no loss token must not skip it.

    `weight` must be a plain tensor (under FSDP2: the unsharded lm_head weight). The gradients
    are handed over in backward, so backward runs once per call (no retain_graph).

    `rows`, when given, must be the indices where targets != ignore_index, in increasing order
    (the collator's `loss_rows`): the result is then identical, without a device sync.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"expected hidden (N, H) and weight (V, H), got {tuple(hidden.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"targets must have shape ({hidden.shape[0]},), got {tuple(targets.shape)}"
        )
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden and weight dtypes differ: {hidden.dtype} vs {weight.dtype}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return _ChunkedLinearCrossEntropy.apply(
        hidden, weight, targets.long(), ignore_index, chunk_size, torch.is_grad_enabled(),
        bias, float(logit_scale), None if softcap is None else float(softcap), rows,
    )  # fmt: skip


# Kept alike on purpose: the head-loss keywords (bias, logit_scale, softcap, rows) that
# CausalLMWithLoss passes to every loss; each implementation spells them out.
def linear_cross_entropy_reference(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    ignore_index: int = IGNORE_INDEX,
    *,
    bias: Tensor | None = None,
    logit_scale: float = 1.0,
    softcap: float | None = None,
) -> Tensor:
    """The plain formula (full N x V logits, fp32 or fp64): ground truth for tests and benchmark."""
    logits = F.linear(hidden, weight, bias).to(torch.promote_types(hidden.dtype, torch.float32))
    logits = logits * logit_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits, targets, reduction="sum", ignore_index=ignore_index)


@dataclass(frozen=True)
class LogitHead:
    """What a model's head does to `hidden @ W.T (+ bias)` before the softmax."""

    logit_scale: float = 1.0
    softcap: float | None = None


def logit_head(config) -> LogitHead:
    """The head transform of a transformers config, or `UserError` for one not reproduced.

    Known: Gemma 2/3 `final_logit_softcapping`, Cohere `logit_scale` (multiplies), Granite
    `logits_scaling` (divides). An LM-head bias is read from the model itself at each step.
    """
    scale = 1.0
    if getattr(config, "logit_scale", None) is not None:
        scale *= float(config.logit_scale)
    if getattr(config, "logits_scaling", None) is not None:
        scale /= float(config.logits_scaling)
    return LogitHead(logit_scale=scale, softcap=getattr(config, "final_logit_softcapping", None))


def make_loss_fn(use_liger: bool, device_type: str) -> LossFn:
    """The loss for a run: `fn(hidden (N, H), weight (V, H), targets (N,), rows=None) -> sum`.

    `rows` (optional) are the indices of the loss tokens, known on the host by the collator.

    `use_liger` (`--use-liger-kernels`) needs CUDA and the liger-kernel package; anything else is
    a UserError so the run stops before loading the model rather than silently running slower.
    """
    if not use_liger:
        return chunked_linear_cross_entropy
    if device_type != "cuda":
        raise UserError(f"--use-liger-kernels needs a CUDA GPU; this run is on {device_type}")
    try:
        # deferred: optional (liger-kernel, --use-liger-kernels)
        from liger_kernel.transformers.fused_linear_cross_entropy import (
            LigerFusedLinearCrossEntropyLoss,
        )
    except ImportError as exc:
        raise UserError(
            "--use-liger-kernels: liger-kernel is not importable "
            f"({exc}); install it with: pip install 'mini-trainer[cuda]'"
        ) from exc

    @functools.cache
    def liger_loss(softcap: float | None):
        """One Liger module per softcap value (a model has one): the cap is its constructor's,
        never an attribute changed between calls."""
        return LigerFusedLinearCrossEntropyLoss(
            ignore_index=IGNORE_INDEX, reduction="sum", softcap=softcap
        )

    # Kept alike on purpose: the head-loss keywords (bias, logit_scale, softcap, rows) that
    # CausalLMWithLoss passes to every loss; each implementation spells them out.
    def liger_fn(
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        *,
        bias: Tensor | None = None,
        logit_scale: float = 1.0,
        softcap: float | None = None,
        rows: Tensor | None = None,
    ) -> Tensor:
        if rows is not None:  # only loss tokens cost anything; same sum
            hidden, targets = hidden.index_select(0, rows), targets.index_select(0, rows)
        if logit_scale != 1.0:  # (s h) W^T = s (h W^T); with a bias, scale (h W^T + b) instead
            if bias is not None:
                raise UserError("--use-liger-kernels: a logit scale with an LM-head bias")
            hidden = hidden * logit_scale
        # Liger's order: (lin_weight, _input, target, bias)
        out = liger_loss(softcap)(weight, hidden, targets, bias)
        if isinstance(out, Tensor):
            return out
        # Versions with z-loss / token-accuracy outputs may wrap the loss.
        return out.loss if hasattr(out, "loss") else out[0]

    return liger_fn
