"""When a run ends, decided here and nowhere else.

- `--training-mode epoch` ends after `--max-epochs` complete epochs, `step` after `--max-steps`
  optimizer steps, `token` once the loss tokens trained on reach `--max-tokens`, `infinite`
  never by itself (a signal or the cluster's time limit stops it; save states periodically).
- `--max-steps`, when given, caps every mode, and is then the schedule's length.

`finished` is checked before each optimizer step; `planned_steps` is the number of steps those
rules give when it is known in advance (the scheduler's length and the progress display).
Which limits each mode needs is checked with the other arguments (`TrainingArgs`).
"""

from __future__ import annotations

import math

from mini_trainer.errors import UserError


def finished(args, *, steps: int, epochs_completed: int, loss_tokens: int) -> bool:
    """Whether the run has reached its end after `steps` steps, `epochs_completed` epochs and
    `loss_tokens` loss tokens."""
    if args.max_steps is not None and steps >= args.max_steps:
        return True
    if args.training_mode == "epoch":
        return epochs_completed >= args.max_epochs
    if args.training_mode == "token":
        return loss_tokens >= args.max_tokens
    return False  # step mode ends by the cap above; infinite mode never by itself


def planned_steps(args, num_samples: int) -> int | None:
    """Optimizer steps the run will take when the rules fix them in advance, else None."""
    if args.training_mode == "epoch":
        epoch_steps = math.ceil(num_samples / args.batch_size) * args.max_epochs
        return min(epoch_steps, args.max_steps or epoch_steps)
    if args.max_steps:  # step mode, or a cap on token and infinite modes
        return args.max_steps
    if args.scheduler_needs_total_steps:
        raise UserError(
            f"--lr-scheduler {args.lr_scheduler}: needs a known number of steps; use "
            "--training-mode epoch or step, or give --max-steps"
        )
    return None
