"""Rank 0's optimizer-state bytes, counted from the run's own optimizer on the meta device.

The optimizer of the `--optimizer` / `--param-dtype` mode (`training/optimizer.optimizer_class`,
the constructor training uses) is built over meta tensors shaped like rank 0's shards (dim 0
split over the ranks, as `fully_shard` does) and asked for each parameter's state before its
first step: torch's AdamW by its own `_init_group`, the lean modes by `new_state` (torchao's
`_new_buffer` for 8-bit). So a mode's layout rules are the real ones (8-bit blocks of 256 with an
fp32 scale each, fp32 state for a shard under 4,096 elements), not a bytes-per-parameter constant.
Nothing is allocated.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mini_trainer.training.lean_adamw import fp32_temporaries
from mini_trainer.training.optimizer import (
    first_state_bytes,
    tensor_bytes,  # noqa: F401 (tests', benchmarks' name)
)

PARAM_BYTES = {"fp32": 4, "bf16": 2}
"""`--param-dtype` -> bytes per element of the master weights and gradients."""


def shard_like(param: torch.Tensor, world: int, dtype: torch.dtype) -> torch.Tensor:
    """A meta tensor of rank 0's shard of `param` (dim 0 split into `world` padded chunks)."""
    shape = tuple(param.shape)
    if shape:
        shape = (math.ceil(shape[0] / world), *shape[1:])
    return torch.empty(shape, dtype=dtype, device="meta")


def state_bytes(wrapped: nn.Module, args, world: int) -> int:
    """Bytes of rank 0's optimizer state for the trainable parameters of `wrapped`."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.param_dtype]
    seen: set[int] = set()
    shards = []
    for param in wrapped.parameters():
        if param.requires_grad and id(param) not in seen:
            seen.add(id(param))
            shards.append(shard_like(param, world, dtype))
    return first_state_bytes(args, shards)


def step_copies(args) -> int:
    """fp32 copies of one parameter that the step of a LeanAdamW mode holds at once (0 for torch's
    AdamW and torchao's, whose temporaries `memory.step_temporaries` counts otherwise)."""
    if args.optimizer == "adamw-8bit" or (args.optimizer, args.param_dtype) == ("adamw", "fp32"):
        return 0
    state = torch.bfloat16 if args.optimizer == "adamw-bf16" else torch.float32
    param = torch.bfloat16 if args.param_dtype == "bf16" else torch.float32
    return fp32_temporaries(state, param)
