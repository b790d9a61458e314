"""Evaluation sums over the LM head, a chunk of loss tokens at a time.

The same idea as the training loss (`training/loss.py`): logits exist for one chunk of loss
tokens at a time, never for the whole packed row, so a long eval set on a big vocabulary fits.
Evaluation needs more than the loss, though: whether the arg-max token is the target (token
accuracy), and whether every answer token of a sample is right (exact match), so this is a
separate, gradient-free function rather than an option of the training loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mini_trainer.labels import IGNORE_INDEX
from mini_trainer.training.loss import DEFAULT_CHUNK_SIZE


@dataclass
class EvalSums:
    """What one packed row contributes; sums add up over rows and ranks."""

    loss_sum: Tensor
    """Summed token cross-entropy, fp64 scalar."""
    num_correct: int
    """Loss tokens whose arg-max prediction equals the target."""
    num_loss_tokens: int
    """Targets != -100 in the row."""
    sample_all_correct: Tensor
    """(num_samples,) bool: every loss token of sample i predicted right."""


# Kept alike on purpose: training/loss.py's head-loss keywords, so the model calls it as a loss.
@torch.no_grad()
def chunked_eval_stats(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    sample_ids: Tensor,
    num_samples: int,
    ignore_index: int = IGNORE_INDEX,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    rows: Tensor | None = None,
    bias: Tensor | None = None,
    logit_scale: float = 1.0,
    softcap: float | None = None,
) -> EvalSums:
    """Loss sum, correct-token count and per-sample all-correct flags of `hidden @ weight.T`.

    hidden (N, H) and weight (V, H) share a dtype; targets (N,) are next-token targets already
    shifted within each sample (the collator's `target_ids`), -100 where there is no loss;
    sample_ids (N,) say which of `num_samples` samples each position belongs to. The softmax runs
    in fp32 at least, and the loss is accumulated in fp64. Peak extra memory is one
    chunk_size x V buffer. `rows` (the loss positions, when the caller knows them), `bias`,
    `logit_scale` and `softcap` are the training loss's keywords: the model's own head transform
    (training/loss.py `logit_head`) is applied to the logits. Ties in the arg-max go to the
    lowest token id, as `torch.argmax` (and so a plain `logits.argmax(-1)`) does.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"expected hidden (N, H) and weight (V, H), got {tuple(hidden.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1] or sample_ids.shape != hidden.shape[:1]:
        raise ValueError(
            f"targets and sample_ids must have shape ({hidden.shape[0]},), got "
            f"{tuple(targets.shape)} and {tuple(sample_ids.shape)}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if rows is None:
        rows = (targets != ignore_index).nonzero().squeeze(1)
    acc_dtype = torch.promote_types(hidden.dtype, torch.float32)
    loss = torch.zeros((), dtype=torch.float64, device=hidden.device)
    correct = torch.zeros((), dtype=torch.int64, device=hidden.device)
    all_correct = torch.ones(num_samples, dtype=torch.bool, device=hidden.device)
    for start in range(0, rows.numel(), chunk_size):
        chunk_rows = rows[start : start + chunk_size]
        t = targets.index_select(0, chunk_rows).long()
        logits = (hidden.index_select(0, chunk_rows) @ weight.T).to(acc_dtype)  # (c, V)
        if bias is not None:
            logits += bias.to(acc_dtype)
        if logit_scale != 1.0:
            logits *= logit_scale
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        target_logit = logits.gather(1, t.unsqueeze(1)).squeeze(1)
        right = logits.argmax(dim=1) == t
        loss += (torch.logsumexp(logits, dim=1) - target_logit).double().sum()
        del logits
        correct += right.sum()
        wrong_samples = sample_ids.index_select(0, chunk_rows)[~right]
        all_correct[wrong_samples] = False
    return EvalSums(
        loss_sum=loss,
        num_correct=int(correct),
        num_loss_tokens=int(rows.numel()),
        sample_all_correct=all_correct,
    )


def sample_ids_of(lengths: list[int], device: torch.device | str = "cpu") -> Tensor:
    """(sum(lengths),) int64: position p of a packed row belongs to sample `sample_ids[p]`."""
    counts = torch.tensor(lengths, dtype=torch.long, device=device)
    return torch.repeat_interleave(torch.arange(len(lengths), device=device), counts)
