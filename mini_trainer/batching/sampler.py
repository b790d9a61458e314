"""Which samples each optimizer step uses, and when training stops.

`BatchSampler` walks one seeded permutation per epoch in consecutive global batches. The
permutation depends only on `seed + epoch`, so every rank computes the same batches without a
process group, and resuming needs only (epoch, position).

Choices:
- The last batch of an epoch may be shorter than `batch_size`: every sample of an epoch is used
  exactly once, none is dropped or repeated to fill the batch. The loss is a token mean over the
  batch, so a shorter batch is simply a smaller step's worth of tokens.
- After the last batch of an epoch the sampler moves on to the next epoch (a new permutation); it
  never ends by itself. When to stop is `should_stop`'s decision.
"""

from __future__ import annotations

import enum
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


class TrainingMode(enum.StrEnum):
    """What ends a run.

    - `epoch`: after `max_epochs` complete epochs.
    - `step`: after `max_steps` optimizer steps.
    - `token`: once the loss tokens trained on reach `max_tokens`.
    - `infinite`: never by itself; the sampler reshuffles forever and the run ends when it is
      stopped from outside (a signal, the scheduler's time limit). Use periodic checkpoints.

    Each mode reads only its own limit; the others are ignored, so defaults for them do no harm.
    """

    EPOCH = "epoch"
    STEP = "step"
    TOKEN = "token"
    INFINITE = "infinite"


_LIMIT_OF_MODE = {
    TrainingMode.EPOCH: "max_epochs",
    TrainingMode.STEP: "max_steps",
    TrainingMode.TOKEN: "max_tokens",
}


def check_mode_limits(
    mode: str | TrainingMode,
    *,
    max_epochs: int | None = None,
    max_steps: int | None = None,
    max_tokens: int | None = None,
) -> TrainingMode:
    """Return `mode` as a `TrainingMode`; raise `ValueError` if it is unknown or its limit unset.

    Called when arguments are parsed, so a run with no way to end fails before any work.
    """
    try:
        mode = TrainingMode(mode)
    except ValueError:
        choices = ", ".join(m.value for m in TrainingMode)
        raise ValueError(f"unknown training mode {mode!r} (expected one of {choices})") from None
    limits = {"max_epochs": max_epochs, "max_steps": max_steps, "max_tokens": max_tokens}
    name = _LIMIT_OF_MODE.get(mode)
    if name is not None:
        value = limits[name]
        flag = "--" + name.replace("_", "-")
        if value is None:
            raise ValueError(f"training mode {mode.value!r} needs {flag} ({name})")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"training mode {mode.value!r} needs {flag} ({name}) to be a positive integer, "
                f"got {value!r}"
            )
    return mode


def should_stop(
    mode: str | TrainingMode,
    *,
    epochs_completed: int,
    steps: int,
    loss_tokens: int,
    max_epochs: int | None,
    max_steps: int | None,
    max_tokens: int | None,
) -> bool:
    """Whether training has reached the end `mode` asks for (checked after each optimizer step).

    `epochs_completed` counts finished epochs, `steps` optimizer steps taken, `loss_tokens` loss
    tokens trained on so far. Limits are validated by `check_mode_limits`.
    """
    mode = check_mode_limits(
        mode, max_epochs=max_epochs, max_steps=max_steps, max_tokens=max_tokens
    )
    if mode is TrainingMode.EPOCH:
        return epochs_completed >= max_epochs
    if mode is TrainingMode.STEP:
        return steps >= max_steps
    if mode is TrainingMode.TOKEN:
        return loss_tokens >= max_tokens
    return False
