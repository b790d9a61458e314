"""Label conventions shared by the data checks, tokenization, batching and the loss."""

from __future__ import annotations

from collections.abc import Sequence

IGNORE_INDEX = -100
"""A label that takes no loss (prompt tokens, padding, sample boundaries)."""


def count_loss_tokens(labels: Sequence[int]) -> int:
    """Loss tokens of one sample: positions t >= 1 with labels[t] != -100.

    Position 0 never counts: nothing precedes it, so no position predicts it. This is the one
    definition of a sample's loss tokens (data index, tokenization, plan, collator, metrics).
    """
    return sum(1 for label in labels[1:] if label != IGNORE_INDEX)
