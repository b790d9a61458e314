"""AdamW with bf16 moments and/or bf16 parameters, updated by stochastic rounding (pure torch).

torch's AdamW keeps its moments in the parameter's dtype and rounds a bf16 parameter's update to
nearest: an update smaller than half of bf16's spacing (2^-8 of the weight) is lost every step,
and a bf16 second moment decayed by beta2 = 0.999 rounds back to itself and never decays. Here
every step computes in fp32 and writes a bf16 parameter back with stochastic rounding (round up
with probability equal to the remainder), so the expected value of what is stored is what fp32
would store and small updates accumulate. A bf16 moment is rounded to nearest where its decay
moves it by several bf16 spacings each step (`rounds_to_nearest`: beta1 = 0.9 and beta2 = 0.95,
the defaults), which errs less than stochastic rounding and draws no random bits, as torchao's
and torchtitan's bf16 states do; stochastically where the decay is finer (beta2 = 0.99, 0.999),
where rounding to nearest would stall it.

The random bits come from a generator seeded by (seed, rank, step, parameter, tensor) alone, not
from torch's global generator: a resumed run draws the same bits as an uninterrupted one whatever
else used the global generator in between (restoring a state steps the optimizer once with zero
gradients, for one). States are DTensors like the parameters (FSDP2), so
torch.distributed.checkpoint saves and loads them as it does torch's AdamW's.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (FSDP2's shards), or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def stochastic_round_(
    target: torch.Tensor, value: torch.Tensor, generator: torch.Generator | None = None
) -> None:
    """Write fp32 `value` into bf16 `target`, rounding each element up or down at random with
    the probabilities that make the expectation exact: add 16 random low bits to the fp32 bit
    pattern and keep its high half (bf16 is the top 16 bits of fp32)."""
    bits = value.float().contiguous().view(torch.int32)
    noise = torch.randint(
        0, 1 << 16, bits.shape, dtype=torch.int32, device=bits.device, generator=generator
    )
    target.copy_(noise.add_(bits).bitwise_and_(-65536).view(torch.float32))  # exact in bf16


NEAREST_MIN_DECAY = 2**-5
"""The least per-step decay (1 - beta) of a bf16 moment stored rounded to nearest: four spacings
at bf16's coarsest (2^-7 of the value), so rounding errs by at most an eighth of a step's decay."""


def rounds_to_nearest(beta: float) -> bool:
    """Whether a bf16 moment decayed by `beta` each step is stored rounded to nearest (else
    stochastically): with a finer decay, rounding to nearest would keep the old value."""
    return 1 - beta >= NEAREST_MIN_DECAY


def noise_generator(device: torch.device, *key: int) -> torch.Generator:
    """A generator whose bits depend on `key` alone (Python hashes a tuple of ints the same in
    every process)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(hash(key) & (2**63 - 1))
    return generator


def fp32_temporaries(state_dtype: torch.dtype, param_dtype: torch.dtype) -> int:
    """fp32 (or int32) copies of one parameter that `LeanAdamW.step` holds at once: a copy of
    each bf16 moment, of a bf16 parameter and its gradient, and one more (the denominator, then
    the rounding's random bits). `plan` counts the step's temporaries with it."""
    low = (state_dtype != torch.float32, param_dtype != torch.float32)
    return 1 + 2 * low[0] + 2 * low[1]


def keep_saved_moments(optimizer, state_dict: dict, dtype: torch.dtype | None = None) -> None:
    """Undo what torch's `Optimizer.load_state_dict` does to the moments: it casts every floating
    state to its parameter's dtype (fp32 moments of a bf16 parameter would lose their low bits,
    and torchao's 8-bit states are no plain tensors). Called after it, with the same
    `state_dict`, whose tensors torch.distributed.checkpoint loaded in the saved dtype."""
    saved_ids = itertools.chain.from_iterable(g["params"] for g in state_dict["param_groups"])
    params = itertools.chain.from_iterable(g["params"] for g in optimizer.param_groups)
    for saved_id, param in zip(saved_ids, params, strict=True):
        saved = state_dict["state"].get(saved_id, {})
        for name in ("exp_avg", "exp_avg_sq"):
            if name in saved:
                value = saved[name].to(param.device)
                optimizer.state[param][name] = value if dtype is None else value.to(dtype)


class LeanAdamW(torch.optim.Optimizer):
    """Decoupled-weight-decay Adam as torch's AdamW computes it (same order of operations, in
    fp32), with its moments stored in `state_dtype` (bf16: rounded as `rounds_to_nearest`
    says) and bf16 parameters stochastically rounded."""

    def __init__(
        self,
        params,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        state_dtype: torch.dtype = torch.float32,
        seed: int = 0,
    ):
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.state_dtype = state_dtype
        self.seed = seed
        self.rank = dist.get_rank() if dist.is_initialized() else 0

    def new_state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        """The state of one parameter before its first step: also what `plan` counts."""
        return {
            "step": torch.tensor(0.0),
            "exp_avg": torch.zeros_like(param, dtype=self.state_dtype),
            "exp_avg_sq": torch.zeros_like(param, dtype=self.state_dtype),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        keep_saved_moments(self, state_dict, self.state_dtype)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        index = 0
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
            nearest = (rounds_to_nearest(beta1), rounds_to_nearest(beta2), False)  # per slot
            for param in group["params"]:
                index += 1
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state.update(self.new_state(param))
                state["step"] += 1
                step = float(state["step"])
                grad = local(param.grad).float()
                exp_avg = local(state["exp_avg"]).float().lerp_(grad, 1 - beta1)
                exp_avg_sq = local(state["exp_avg_sq"]).float().mul_(beta2)
                exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)
                weights = local(param).float()
                weights.mul_(1 - lr * decay)
                bias1, bias2 = 1 - beta1**step, 1 - beta2**step
                denom = exp_avg_sq.sqrt().div_(math.sqrt(bias2)).add_(eps)
                weights.addcdiv_(exp_avg, denom, value=-lr / bias1)
                del denom  # before the rounding's random bits: one temporary at a time
                key = (self.seed, self.rank, int(step), index)
                for slot, (target, value) in enumerate(
                    ((state["exp_avg"], exp_avg), (state["exp_avg_sq"], exp_avg_sq),
                     (param, weights))
                ):  # fmt: skip
                    target = local(target)
                    if target.dtype == torch.bfloat16 and not nearest[slot]:
                        stochastic_round_(target, value, noise_generator(value.device, *key, slot))
                    else:
                        target.copy_(value)
        return loss
