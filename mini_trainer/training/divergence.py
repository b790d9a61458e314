"""Stop at the first non-finite loss or gradient norm, before it reaches the weights.

A NaN or inf loss (or gradient norm) poisons every weight at the next optimizer step, and from
then on every step, state and export is garbage. The step is checked before `optimizer.step()`:
the update is skipped, the run stops with `EXIT_DIVERGED` and a line naming the step, no state
is saved and nothing is exported, so the newest state on disk is the last good one. The weights
are also checked (on every rank, one all-reduce) before each save and export, which catches an
update that overflowed although its inputs were finite.
"""

from __future__ import annotations

import math

import torch

from mini_trainer.distributed.runtime import Runtime, all_reduce_max
from mini_trainer.errors import UserError
from mini_trainer.training.run_folder import newest_intact_name

EXIT_DIVERGED = 3
"""Exit status of a run stopped by a non-finite loss, gradient norm or weight."""


class Diverged(UserError):
    """Training produced a non-finite value; `at_step` names the step in the message."""

    def __init__(self, what: str):
        super().__init__(what, exit_code=EXIT_DIVERGED)
        self.what = what

    def at_step(self, step: int, out_dir) -> Diverged:
        return Diverged(
            f"step {step}: {self.what}; stopped with nothing saved or exported at this step "
            f"(last saved state: {newest_intact_name(out_dir)}); lower --learning-rate or "
            "check the data, and start again in a new --output-dir"
        )


def check_step(loss_sum: float, grad_norm: float) -> None:
    """Raise `Diverged` unless the step's summed loss and gradient norm are finite."""
    if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):
        raise Diverged(f"non-finite loss ({loss_sum}) or gradient norm ({grad_norm})")


def check_weights(model: torch.nn.Module, runtime: Runtime) -> None:
    """Raise `Diverged` on every rank if any rank holds a non-finite weight (before a save)."""
    bad = 0.0
    with torch.no_grad():
        for param in model.parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            if not bool(torch.isfinite(local).all()):
                bad = 1.0
                break
    (any_bad,) = all_reduce_max([bad], runtime)
    if any_bad:
        raise Diverged("non-finite weights after the optimizer step")
