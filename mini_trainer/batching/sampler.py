"""Which samples each optimizer step uses.

`BatchSampler` walks one seeded permutation per epoch in consecutive global batches. The
permutation depends only on `seed + epoch`, so every rank computes the same batches without a
process group, and resuming needs only (epoch, position).

Choices:
- The last batch of an epoch may be shorter than `batch_size`: every sample of an epoch is used
  exactly once, none is dropped or repeated to fill the batch. The loss is a token mean over the
  batch, so a shorter batch is simply a smaller step's worth of tokens.
- After the last batch of an epoch the sampler moves on to the next epoch (a new permutation); it
  never ends by itself. When to stop is `training/stopping.py`'s decision.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GlobalBatch:
    """One optimizer step's samples, the same on every rank."""

    epoch: int
    """Epoch these samples belong to (0-based)."""
    indices: np.ndarray
    """Dataset indices, int64, in sampling order."""
    ends_epoch: bool
    """True for the last batch of `epoch`."""


class BatchSampler:
    """Global batches of `batch_size` dataset indices, reshuffled every epoch, forever.

    Epoch `e` uses the permutation `numpy.random.default_rng(seed + e).permutation(num_samples)`,
    cut into consecutive batches of `batch_size`; the last one holds the remainder.
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int):
        for name, value, minimum in (
            ("num_samples", num_samples, 1),
            ("batch_size", batch_size, 1),
            ("seed", seed, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if value < minimum:
                raise ValueError(f"{name} must be at least {minimum}, got {value}")
        self.num_samples = int(num_samples)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self._epoch = 0
        self._position = 0
        self._permutation: np.ndarray | None = None  # for self._epoch, computed on demand

    @property
    def epoch(self) -> int:
        """Epoch of the next batch."""
        return self._epoch

    @property
    def position(self) -> int:
        """Offset of the next batch in this epoch's permutation (0 at the start of an epoch)."""
        return self._position

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of epoch `epoch` (int64 dataset indices)."""
        return np.random.default_rng(self.seed + epoch).permutation(self.num_samples)

    def next_batch(self) -> GlobalBatch:
        """The next global batch; after an epoch's last batch, the next epoch begins."""
        if self._permutation is None:
            self._permutation = self.permutation(self._epoch)
        end = min(self._position + self.batch_size, self.num_samples)
        batch = GlobalBatch(
            epoch=self._epoch,
            indices=self._permutation[self._position : end].astype(np.int64, copy=True),
            ends_epoch=end == self.num_samples,
        )
        if batch.ends_epoch:
            self._epoch += 1
            self._position = 0
            self._permutation = None
        else:
            self._position = end
        return batch

    def state_dict(self) -> dict:
        """JSON-serialisable state; `load_state_dict` of it continues with the same batches."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict`; refuse one from a sampler over other data or settings."""
        for key in ("num_samples", "batch_size", "seed"):
            if state.get(key) != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state.get(key)!r} but this run has "
                    f"{key}={getattr(self, key)!r}; resuming would not continue the same order"
                )
        epoch, position = state.get("epoch"), state.get("position")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"sampler state has an invalid epoch {epoch!r}")
        if (
            not isinstance(position, int)
            or isinstance(position, bool)
            or not 0 <= position < self.num_samples
        ):
            raise ValueError(f"sampler state has an invalid position {position!r}")
        self._epoch = epoch
        self._position = position
        self._permutation = None
