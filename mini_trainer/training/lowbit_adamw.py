"""torchao's 8-bit AdamW, with a learning rate the scheduler can set like any
optimizer's.

torchao keeps each group's `lr` as a tensor (its compiled step takes it as an input, so a new
value needs no recompile) and refuses a step after the value was replaced by a float, which is
what every torch/transformers scheduler does. Here `param_groups` hold floats, as everywhere
else (the scheduler, `metrics.jsonl`, the saved state), and each step fills torchao's tensors
from them (`fill_`, never assignment) for the duration of torchao's own step.

The state (`exp_avg`, `exp_avg_sq`) is a torchao tensor subclass per parameter: 8-bit codes and
one fp32 scale per block of 256 elements of this rank's shard; a shard under
4,096 elements, or not a multiple of the block, keeps plain fp32 state. Blocks are cut from the
local shard, so the state's layout depends on the world size (optimizer_options.WORLD_SIZE_BOUND).
The first steps compile torchao's update, once per shard shape.
"""

from __future__ import annotations

import torch
from torchao.optim import AdamW8bit as _TorchaoAdamW8bit

from mini_trainer.training.lean_adamw import keep_saved_moments


class _FloatLR:
    """What is added to torchao's optimizer: float `lr` between steps, fp32 states
    for bf16 parameters, moments kept as saved on load, and `new_state` for `plan`."""

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)  # torchao turns lr into a tensor
        group = self.param_groups[-1]
        group["lr"] = float(group["lr"])

    @torch.no_grad()
    def step(self, closure=None):
        tensors = getattr(self, "_lr_tensors", None)
        if tensors is None or len(tensors) != len(self.param_groups):
            tensors = self._lr_tensors = [
                torch.tensor(0.0, dtype=torch.float32) for _ in self.param_groups
            ]
        values = [group["lr"] for group in self.param_groups]
        for group, tensor, value in zip(self.param_groups, tensors, values, strict=True):
            group["lr"] = tensor.fill_(float(value))
        try:
            return super().step(closure)
        finally:
            for group, value in zip(self.param_groups, values, strict=True):
                group["lr"] = value

    def _new_buffer(self, param: torch.Tensor, signed: bool):
        """torchao's state, always over fp32 (its 8-bit state of a bf16 parameter fails to
        compile on torch 2.13: `aten.view.dtype` is not implemented for it)."""
        if param.dtype != torch.float32:
            param = torch.empty_like(param, dtype=torch.float32)
        return super()._new_buffer(param, signed)

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        keep_saved_moments(self, state_dict)

    def new_state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        """The state of one parameter before its first step, built by torchao's own
        `_new_buffer` (what `plan` counts)."""
        return {
            "step": torch.tensor(0.0),
            "exp_avg": self._new_buffer(param, True),
            "exp_avg_sq": self._new_buffer(param, False),
        }


class AdamW8bit(_FloatLR, _TorchaoAdamW8bit):
    """`torchao.optim.AdamW8bit`, blocks of 256."""
