"""LwF (Learning without Forgetting) as self-distillation: the hooks of `mini_trainer/method.py`.

The teacher is the stage's starting weights (`--model-name-or-path`: the previous stage's final/),
loaded a second time, sharded by FSDP2 exactly as the student, frozen, in eval mode (bf16 compute
on a GPU, as the student's). For every micro-batch (`micro_batch_loss`) the teacher runs forward
first (no gradients) and keeps, per loss token, its top-k logits at temperature T, their indices
and the log-sum-exp over the whole vocabulary (so the kept probabilities are exact); then the
student's loss is its cross-entropy plus `weight * T^2 * sum_tokens KL(p_teacher || q_student)`
over those k tokens and one bucket for all the others (k >= the vocabulary: the exact KL;
smaller: the KL of the two distributions coarsened to k + 1 outcomes, which is never negative
and at most the full KL; the k terms alone, as plain top-k distillation sums them, go negative
once the student puts more mass on the teacher's top k than the teacher does).

Neither model's tokens x vocabulary logits ever exist whole: the teacher's are reduced chunk by
chunk, the student's KL is computed chunk by chunk under activation checkpointing (one chunk's
logits in forward, recomputed one chunk at a time in backward). The cost is a teacher forward
per micro-batch (about a third of a training step's FLOPs) and a teacher shard in memory.
Weight 0 leaves the model's own loss in place: the run is SFT bit for bit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from mini_trainer.distributed.runtime import all_reduce_sum
from mini_trainer.labels import IGNORE_INDEX
from mini_trainer.method import FullFineTuning, MethodContext
from mini_trainer.training.loss import DEFAULT_CHUNK_SIZE, LossFn, chunked_linear_cross_entropy
from mini_trainer.training.model_setup import ModelSpec, build_model

log = logging.getLogger("mini_trainer")


def head_logits(hidden, weight, bias, logit_scale, softcap) -> Tensor:
    """The model's head transform of `hidden @ weight.T` (bias, scale, soft-cap), fp32 at least."""
    logits = (hidden @ weight.T).to(torch.promote_types(hidden.dtype, torch.float32))
    if bias is not None:
        logits = logits + bias
    if logit_scale != 1.0:
        logits = logits * logit_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return logits


@dataclass
class TeacherTopK:
    """Per loss token (in `rows` order): the teacher's top-k log-probabilities at T, and where."""

    log_probs: Tensor
    """(n, k) log p_teacher of the kept tokens (exact: normalized over the whole vocabulary)."""
    indices: Tensor
    """(n, k) their token ids."""
    log_rest: Tensor | None = None
    """(n,) log of the teacher's mass outside them; None when k covers the vocabulary."""


def teacher_top_k(
    hidden, weight, rows, temperature: float, k: int, *, bias=None, logit_scale=1.0,
    softcap=None, chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> TeacherTopK:  # fmt: skip
    """The teacher's kept distribution, a chunk of tokens at a time (no gradients)."""
    k = min(k, weight.shape[0])
    tail = k < weight.shape[0]
    values, indices, rests = [], [], []
    for start in range(0, rows.numel(), chunk_size):
        h = hidden.index_select(0, rows[start : start + chunk_size])
        logits = head_logits(h, weight, bias, logit_scale, softcap) / temperature
        top, where = logits.topk(k, dim=1)
        total = logits.logsumexp(dim=1, keepdim=True)
        values.append(top - total)
        indices.append(where)
        if tail:
            rests.append(_log_rest(logits, where) - total.squeeze(1))
    if not values:
        empty = torch.zeros((0, k), device=hidden.device)
        return TeacherTopK(empty, empty.long(), empty[:, 0] if tail else None)
    rest = torch.cat(rests) if tail else None
    return TeacherTopK(torch.cat(values), torch.cat(indices), rest)


def _log_rest(logits: Tensor, kept: Tensor) -> Tensor:
    """log-sum-exp of each row's logits outside `kept` (computed, not 1 minus the kept mass,
    so a tiny tail keeps its precision)."""
    return logits.scatter(1, kept, float("-inf")).logsumexp(dim=1)


def _chunk_kl(
    h, weight, bias, log_p, indices, log_p_rest, temperature, logit_scale, softcap
) -> Tensor:
    """sum over the chunk's tokens of sum_k p (log p - log q), plus the same term for the mass
    outside the kept tokens when there is one; q the student's softmax at T."""
    logits = head_logits(h, weight, bias, logit_scale, softcap) / temperature
    total = logits.logsumexp(dim=1, keepdim=True)
    log_q = logits.gather(1, indices) - total
    kl = (log_p.exp() * (log_p - log_q)).sum()
    if log_p_rest is not None:
        log_q_rest = _log_rest(logits, indices) - total.squeeze(1)
        kl = kl + (log_p_rest.exp() * (log_p_rest - log_q_rest)).sum()
    return kl


def distillation_kl(
    hidden, weight, rows, teacher: TeacherTopK, temperature: float, *, bias=None,
    logit_scale=1.0, softcap=None, chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:  # fmt: skip
    """KL(teacher || student) summed over the loss tokens `rows`, chunk by chunk (checkpointed:
    only one chunk's logits exist at a time, in forward and in backward)."""
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, rows.numel(), chunk_size):
        end = start + chunk_size
        h = hidden.index_select(0, rows[start:end])
        total = total + checkpoint(
            _chunk_kl, h, weight, bias, teacher.log_probs[start:end], teacher.indices[start:end],
            None if teacher.log_rest is None else teacher.log_rest[start:end], temperature,
            logit_scale, softcap, use_reentrant=False,
        )  # fmt: skip
    return total


def _rows(targets: Tensor, rows: Tensor | None) -> Tensor:
    return rows if rows is not None else (targets != IGNORE_INDEX).nonzero().squeeze(1)


class LwF(FullFineTuning):
    """Learning without Forgetting by self-distillation (`methods/lwf.py`)."""

    name = "lwf"
    keeps_teacher = True
    """The plan counts the teacher's parameter shard (bf16 on a GPU, fp32 on the CPU)."""

    def __init__(self, args):
        self.args = args
        self.weight = float(args.lwf_weight)
        self.temperature = float(args.lwf_temperature)
        self.top_k = int(args.lwf_top_k)
        self.runtime = None
        self.teacher = None
        self._kl = self._tokens = None

    def adapt_model(self, model, context: MethodContext | None = None) -> None:
        self.runtime = context.runtime if context is not None else None

    def _teacher(self):
        """The frozen teacher, built at the first micro-batch (every rank: collective)."""
        if self.teacher is None:
            bf16 = self.runtime is not None and self.runtime.is_cuda
            spec = ModelSpec(self.args.model_name_or_path, param_dtype="bf16" if bf16 else "fp32")
            teacher, _ = build_model(spec, None, self.runtime, FullFineTuning())
            teacher.requires_grad_(False)
            self.teacher = teacher.eval()
        return self.teacher

    def micro_batch_loss(self, micro, attention_kwargs: dict) -> LossFn | None:
        """CE + weight T^2 KL for this micro-batch (the teacher runs now); None at weight 0."""
        if self.weight == 0:
            return None
        kept: dict[str, TeacherTopK] = {}

        def capture(hidden, weight, targets, *, rows=None, bias=None, logit_scale=1.0,
                    softcap=None) -> Tensor:  # fmt: skip
            kept["top"] = teacher_top_k(
                hidden, weight, _rows(targets, rows), self.temperature, self.top_k, bias=bias,
                logit_scale=logit_scale, softcap=softcap,
            )  # fmt: skip
            return hidden.new_zeros(())

        with torch.no_grad():
            self._teacher()(
                micro.input_ids, micro.position_ids, micro.target_ids, loss_rows=micro.loss_rows,
                loss_fn=capture, **attention_kwargs,
            )  # fmt: skip

        def loss(hidden, weight, targets, *, rows=None, bias=None, logit_scale=1.0,
                 softcap=None) -> Tensor:  # fmt: skip
            rows = _rows(targets, rows)
            ce = chunked_linear_cross_entropy(
                hidden, weight, targets, rows=rows, bias=bias, logit_scale=logit_scale,
                softcap=softcap,
            )  # fmt: skip
            kl = distillation_kl(
                hidden, weight, rows, kept["top"], self.temperature, bias=bias,
                logit_scale=logit_scale, softcap=softcap,
            )  # fmt: skip
            self._add(kl.detach(), rows.numel())
            return ce + (self.weight * self.temperature**2) * kl

        return loss

    def _add(self, kl: Tensor, tokens: int) -> None:
        self._kl = kl.double() if self._kl is None else self._kl + kl.double()
        self._tokens = (self._tokens or 0) + tokens

    def step_metrics(self) -> dict[str, float]:
        """`lwf_kl`: the step's mean KL(teacher || student) per loss token, over all ranks."""
        if self._kl is None:
            return {}
        values = [float(self._kl), float(self._tokens)]
        self._kl = self._tokens = None
        if self.runtime is not None:
            values = all_reduce_sum(values, self.runtime)
        return {"lwf_kl": values[0] / max(values[1], 1.0)}

    def describe(self) -> dict:
        return {
            "method": self.name,
            "weight": self.weight,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "teacher": self.args.model_name_or_path,
        }
