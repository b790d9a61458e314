"""The optimizer phase: AdamW over the method's parameter groups, and the scheduler."""

from __future__ import annotations

import logging
import math

import torch
from transformers import get_scheduler

from mini_trainer.training_args import TrainingArgs


def build_optimizer(args: TrainingArgs, param_groups: list[dict]) -> torch.optim.AdamW:
    """AdamW with the run's betas and epsilon; each group carries its own weight decay."""
    return torch.optim.AdamW(
        param_groups,
        lr=args.learning_rate,
        betas=(args.beta1, args.beta2),
        eps=args.eps,
        weight_decay=args.weight_decay,
    )


def build_scheduler(args: TrainingArgs, optimizer, total_steps: int | None):
    """The transformers scheduler; warns when the warm-up outlasts the planned steps.

    With --max-steps that is an argument error (`TrainingArgs`); in epoch mode the planned
    steps depend on the data, so it is found here, and only warned about: the run is valid,
    its learning rate just never reaches the peak.
    """
    if total_steps is not None and args.num_warmup_steps > total_steps:
        logging.getLogger("mini_trainer").warning(
            "--num-warmup-steps %d is more than the %d planned steps: the learning rate never "
            "reaches --learning-rate",
            args.num_warmup_steps,
            total_steps,
        )

    return get_scheduler(
        args.lr_scheduler,
        optimizer,
        num_warmup_steps=args.num_warmup_steps,
        num_training_steps=total_steps,
    )


def finish_gradients(model: torch.nn.Module, method, grad_clip: float) -> torch.Tensor:
    """The step's gradient norm, after the method has shaped the gradients (OSFT removes their
    components in the frozen subspace) and then the clip: the norm that is logged and clipped is
    that of the gradient the optimizer applies. `grad_clip` 0 disables clipping."""
    method.before_optimizer_step(model)
    max_norm = grad_clip if grad_clip > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
