"""Which fine-tuning method a run uses: the registry the training loop asks.

The methods live beside what they need (full fine-tuning in `mini_trainer/method.py`, with the
protocol; OSFT in `osft/`); only the training side imports this module, so a method never
imports the loop that picks it.
"""

from __future__ import annotations

from mini_trainer.method import FullFineTuning, TrainingMethod
from mini_trainer.osft.method import OSFT
from mini_trainer.training_args import TrainingArgs


def make_method(args: TrainingArgs) -> TrainingMethod:
    """The method the arguments ask for: OSFT with --osft, full fine-tuning otherwise."""
    if args.osft:
        return OSFT(args)
    return FullFineTuning()
