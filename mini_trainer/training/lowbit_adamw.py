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

import functools

import torch
from torchao.optim import AdamW8bit as _TorchaoAdamW8bit
from torchao.optim.adam import single_param_adam

from mini_trainer.training.lean_adamw import keep_saved_moments, local


@functools.cache
def _compiled_update():
    """torchao's per-parameter update, compiled as torchao compiles it (once per shape); eager
    when torch's own switch `TORCH_COMPILE_DISABLE=1` is set (a fullgraph compile then fails
    with "found no compiled frames" instead of running the function)."""
    if torch._dynamo.config.disable:
        return single_param_adam
    return torch.compile(single_param_adam, fullgraph=True, dynamic=False)


class _FloatLR:
    """What is added to torchao's optimizer: float `lr` between steps, the update on local
    shards, fp32 states for bf16 parameters, moments kept as saved on load, and `new_state`
    for `plan`."""

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)  # torchao turns lr into a tensor
        group = self.param_groups[-1]
        group["lr"] = float(group["lr"])

    @torch.no_grad()
    def step(self, closure=None):
        """torchao's step, on each rank's local shard: torchao compiles its update for the
        DTensor, whose shard shapes differ between ranks when dim 0 does not divide evenly (and
        a shard under 4,096 elements keeps fp32 state on one rank but not another), which fails
        on the other ranks; a local tensor compiles for this rank's own shape."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        tensors = getattr(self, "_lr_tensors", None)
        if tensors is None or len(tensors) != len(self.param_groups):
            tensors = self._lr_tensors = [
                torch.tensor(0.0, dtype=torch.float32) for _ in self.param_groups
            ]
        with torch._dynamo.utils.disable_cache_limit():
            for group, lr in zip(self.param_groups, tensors, strict=True):
                lr.fill_(float(group["lr"]))
                beta1, beta2 = group["betas"]
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    state = self.state[param]
                    if not state:
                        state.update(self.new_state(param))
                    state["step"] += 1
                    _compiled_update()(
                        local(param.detach()), local(param.grad), state["step"],
                        local(state["exp_avg"]), local(state["exp_avg_sq"]), None, lr, beta1,
                        beta2, group["weight_decay"], group["eps"], True,
                        self.bf16_stochastic_round and param.dtype is torch.bfloat16,
                    )  # fmt: skip
        return loss

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
