"""The optimizer phase: AdamW over the method's parameter groups (in the `--optimizer` and
`--param-dtype` mode), and the scheduler.

Which mode builds which optimizer is decided here, once; which combinations are allowed is
`optimizer_options.py`'s. The default (adamw, fp32 parameters) is torch's AdamW exactly as it
always was, so its numerics are unchanged bit for bit.
"""

from __future__ import annotations

import functools
import logging
import math

import torch
from transformers import get_scheduler

from mini_trainer.training.lean_adamw import LeanAdamW
from mini_trainer.training_args import TrainingArgs


def build_optimizer(args: TrainingArgs, param_groups: list[dict]) -> torch.optim.Optimizer:
    """AdamW with the run's betas and epsilon, states in the `--optimizer` mode; each group
    carries its own weight decay."""
    kwargs = {
        "lr": args.learning_rate,
        "betas": (args.beta1, args.beta2),
        "eps": args.eps,
        "weight_decay": args.weight_decay,
    }
    return optimizer_class(args)(param_groups, **kwargs)


def optimizer_class(args: TrainingArgs):
    """The optimizer of a mode, as a constructor of (param_groups, lr, betas, eps,
    weight_decay); `plan` counts the states of the same constructor."""
    if args.optimizer == "adamw-8bit":
        from mini_trainer.training.lowbit_adamw import AdamW8bit  # deferred: torchao

        return functools.partial(AdamW8bit, bf16_stochastic_round=args.param_dtype == "bf16")
    if args.optimizer == "adamw" and args.param_dtype == "fp32":
        return torch.optim.AdamW
    if args.optimizer in ("adamw", "adamw-bf16"):
        state_dtype = torch.bfloat16 if args.optimizer == "adamw-bf16" else torch.float32
        return functools.partial(LeanAdamW, state_dtype=state_dtype, seed=args.seed)
    raise ValueError(f"--optimizer {args.optimizer}: no optimizer (refused by TrainingArgs)")


def tensor_bytes(value) -> int:
    """Bytes of a state value: a tensor, or a tensor subclass by its inner tensors (torchao)."""
    if not isinstance(value, torch.Tensor):
        return 0
    flatten = getattr(type(value), "__tensor_flatten__", None)
    if flatten is not None and type(value) is not torch.Tensor:
        names, _ = value.__tensor_flatten__()
        return sum(tensor_bytes(getattr(value, name)) for name in names)
    return value.numel() * value.element_size()


def first_state_bytes(args: TrainingArgs, shards: list[torch.Tensor]) -> int:
    """Bytes of the state the optimizer of `args` gives `shards` (meta tensors shaped as a
    rank's shards) at their first step, asked of the mode's own optimizer (torch's AdamW by its
    `_init_group`, the lean modes by `new_state`): nothing is allocated. `plan` counts rank 0's
    state with it, training the staged copy of `--async-save` before the first step."""
    if not shards:
        return 0
    optimizer = optimizer_class(args)(
        shards, lr=args.learning_rate, betas=(args.beta1, args.beta2), eps=args.eps,
        weight_decay=args.weight_decay,
    )  # fmt: skip
    return sum(
        tensor_bytes(value) for shard in shards for value in new_state(optimizer, shard).values()
    )


def new_state(optimizer, shard: torch.Tensor) -> dict:
    """The state `optimizer` gives `shard` at its first step."""
    if hasattr(optimizer, "new_state"):
        return optimizer.new_state(shard)
    # torch's AdamW: its own state initialisation, for this one parameter
    group = {**optimizer.param_groups[0], "params": [shard]}
    shard.grad = torch.empty_like(shard)
    optimizer._init_group(group, [], [], [], [], [], [])
    shard.grad = None
    return optimizer.state[shard]


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
