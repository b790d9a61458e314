"""From a global batch to per-rank packed rows: the step plan and the padding-free collator.

Label alignment. A sample's `labels[t]` is the token the model should produce after reading
tokens up to `t - 1` (the Hugging Face convention: the loss shifts labels by one). A packed row
must not shift across sample boundaries, or each sample's last token would be trained to predict
the next sample's first token. So the shift happens here, inside each sample: the row carries
`target_ids[t] = labels[t + 1]` of the same sample, and -100 at every sample's last position.
The loss is then plain cross-entropy of `logits[t]` against `target_ids[t]`, with no shift.

Loss normalisation. Each micro-batch's summed loss is divided by `batch_num_loss_tokens`, the loss
tokens of the whole global batch on all ranks, which every rank knows from the plan without
communication. Summing these over micro-batches and ranks (gradient accumulation plus the
all-reduce) gives the exact token mean of the global batch, whatever the split.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import torch

from mini_trainer.batching.packing import plan_micro_batches
from mini_trainer.labels import IGNORE_INDEX, count_loss_tokens

__all__ = ["IGNORE_INDEX", "count_loss_tokens", "collate_packed", "plan_step"]


@dataclass
class PackedMicroBatch:
    """One rank's row for one micro-step: its samples concatenated, no padding."""

    input_ids: torch.Tensor
    """(1, T) int64."""
    position_ids: torch.Tensor
    """(1, T) int64, restarting at 0 for each sample: how attention tells samples apart."""
    target_ids: torch.Tensor
    """(1, T) int64: next-token targets shifted within each sample, -100 where no loss."""
    num_loss_tokens: int
    """Targets != -100 in this row."""
    batch_num_loss_tokens: int
    """Loss tokens of the whole global batch (all micro-batches, all ranks): the loss divisor."""
    num_tokens: int
    """Real tokens in this row (0 for a dummy)."""
    num_samples: int
    is_dummy: bool
    """True for the stand-in row of a rank with no sample in this micro-batch."""
    seq_starts: list[int]
    """[0, s1, ..., T]: where each sample starts in the row, and its end (host memory)."""
    cu_seqlens: torch.Tensor
    """`seq_starts` as an int32 tensor: what varlen attention kernels take."""
    max_seqlen: int
    """The longest sample of the row."""
    loss_rows: torch.Tensor
    """(num_loss_tokens,) int64: positions in the row whose target is not -100. Built on the
    host, so the loss needs no device-side `nonzero` (a host sync on GPU)."""
    context: object | None = None
    """With `--context-parallel N`: this rank's chunk of its group's row (a
    `batching.context_split.ChunkLayout`, host memory); None for a whole row."""

    TENSORS: ClassVar[tuple[str, ...]] = (
        "input_ids",
        "position_ids",
        "target_ids",
        "cu_seqlens",
        "loss_rows",
    )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedMicroBatch:
        """A copy with the tensors on `device` (`non_blocking` from pinned memory on CUDA)."""
        moved = {
            name: getattr(self, name).to(device, non_blocking=non_blocking) for name in self.TENSORS
        }
        return replace(self, **moved)

    def pin_memory(self) -> PackedMicroBatch:
        """A copy with the tensors in page-locked host memory, for asynchronous copies."""
        return replace(self, **{name: getattr(self, name).pin_memory() for name in self.TENSORS})


def collate_packed(
    samples: list[dict], batch_num_loss_tokens: int, pad_token_id: int = 0
) -> PackedMicroBatch:
    """Pack `samples` (each `{"input_ids": [...], "labels": [...]}`) into one row.

    An empty list gives a dummy row: one `pad_token_id` with target -100. The rank runs its
    forward and backward on it like any other (a zero loss, zero gradients), so every rank makes
    the same collective calls in every micro-step.
    """
    if not samples:
        one = torch.tensor([[pad_token_id]], dtype=torch.long)
        return PackedMicroBatch(
            input_ids=one,
            position_ids=torch.zeros((1, 1), dtype=torch.long),
            target_ids=torch.full((1, 1), IGNORE_INDEX, dtype=torch.long),
            num_loss_tokens=0,
            batch_num_loss_tokens=int(batch_num_loss_tokens),
            num_tokens=0,
            num_samples=0,
            is_dummy=True,
            seq_starts=[0, 1],
            cu_seqlens=torch.tensor([0, 1], dtype=torch.int32),
            max_seqlen=1,
            loss_rows=torch.zeros((0,), dtype=torch.long),
        )
    input_ids: list[int] = []
    position_ids: list[int] = []
    target_ids: list[int] = []
    seq_starts = [0]
    for i, sample in enumerate(samples):
        ids, labels = sample["input_ids"], sample["labels"]
        if len(ids) == 0:
            raise ValueError(f"sample {i} of the micro-batch is empty")
        if len(labels) != len(ids):
            raise ValueError(
                f"sample {i} of the micro-batch has {len(ids)} input_ids but {len(labels)} labels"
            )
        input_ids.extend(ids)
        position_ids.extend(range(len(ids)))
        target_ids.extend(labels[1:])
        target_ids.append(IGNORE_INDEX)
        seq_starts.append(len(input_ids))
    targets = torch.tensor([target_ids], dtype=torch.long)
    loss_rows = torch.nonzero(targets[0] != IGNORE_INDEX).flatten()  # host tensor: no sync
    return PackedMicroBatch(
        input_ids=torch.tensor([input_ids], dtype=torch.long),
        position_ids=torch.tensor([position_ids], dtype=torch.long),
        target_ids=targets,
        num_loss_tokens=int(loss_rows.numel()),
        batch_num_loss_tokens=int(batch_num_loss_tokens),
        num_tokens=len(input_ids),
        num_samples=len(samples),
        is_dummy=False,
        seq_starts=seq_starts,
        cu_seqlens=torch.tensor(seq_starts, dtype=torch.int32),
        max_seqlen=max(b - a for a, b in zip(seq_starts[:-1], seq_starts[1:], strict=True)),
        loss_rows=loss_rows,
    )


@dataclass(frozen=True)
class StepPlan:
    """How one global batch is split, the same on every rank."""

    micro_batches: list[list[list[int]]]
    """`micro_batches[m][r]`: dataset indices rank `r` packs in micro-batch `m` (maybe none)."""
    batch_num_loss_tokens: int
    """Loss tokens of the whole global batch."""
    num_tokens: int
    """Tokens of the whole global batch."""
    num_samples: int

    @property
    def num_micro_batches(self) -> int:
        return len(self.micro_batches)

    def for_rank(self, rank: int) -> list[list[int]]:
        """Rank `rank`'s dataset indices, one list per micro-batch."""
        return [micro_batch[rank] for micro_batch in self.micro_batches]


def plan_step(
    batch_indices: np.ndarray,
    lengths: np.ndarray,
    loss_tokens: np.ndarray,
    num_ranks: int,
    max_tokens_per_rank: int,
) -> StepPlan:
    """Plan one optimizer step: `plan_micro_batches` on the batch, mapped to dataset indices.

    `lengths` and `loss_tokens` are per dataset index (from the data index); `batch_indices` are
    the global batch's dataset indices. Pure and deterministic, so every rank computes the same
    plan; rank `r` then collates `[dataset[i] for i in plan.micro_batches[m][r]]`.
    """
    batch_indices = np.asarray(batch_indices, dtype=np.int64)
    batch_lengths = np.asarray(lengths)[batch_indices]
    over = np.flatnonzero(batch_lengths > max_tokens_per_rank)
    if over.size:
        index = int(batch_indices[over[0]])
        raise ValueError(
            f"sample {index} has {int(batch_lengths[over[0]])} tokens, more than "
            f"max_tokens_per_rank={max_tokens_per_rank}"
        )
    plan = plan_micro_batches(batch_lengths, num_ranks, max_tokens_per_rank)
    index_list = batch_indices.tolist()
    return StepPlan(
        micro_batches=[[[index_list[p] for p in rank] for rank in micro] for micro in plan],
        batch_num_loss_tokens=int(np.asarray(loss_tokens)[batch_indices].sum()),
        num_tokens=int(batch_lengths.sum()),
        num_samples=len(index_list),
    )
