"""The factorized linear layer that stands in for a target weight during training.

W = U_high S_high V_highᵀ + U_low S_low V_lowᵀ. The high factors are frozen parameters (FSDP2
shards them like any other), the low ones train. The forward rebuilds W and runs one dense
matmul, which costs one rows x cols x r product per call, independent of the number of tokens,
instead of the factor path's two skinny matmuls per token. The backward rebuilds W again (for the
input's gradient) rather than keeping it from the forward, so no layer holds a dense weight
between its forward and its backward: peak memory stays that of the factors. The low factors'
gradients go through the factors (tokens x (r - k) products), never through a dense dL/dW.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mini_trainer.osft.svd import FACTOR_NAMES, FROZEN_FACTORS


def _weight(u_high, s_high, v_high, u_low, s_low, v_low) -> Tensor:
    high = (u_high * s_high) @ v_high.mT
    return torch.addmm(high, u_low * s_low, v_low.mT)


class _FactorizedLinear(torch.autograd.Function):
    """y = x Wᵀ + b with W from the factors; gradients only for x, the low factors and b."""

    @staticmethod
    def forward(ctx, x, u_high, s_high, v_high, u_low, s_low, v_low, bias):
        factors = (u_high, s_high, v_high, u_low, s_low, v_low)
        ctx.save_for_backward(x, *factors)
        return F.linear(x, _weight(*factors), bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, *factors = ctx.saved_tensors
        _, _, _, u_low, s_low, v_low = factors
        grad_x = grad_out @ _weight(*factors) if ctx.needs_input_grad[0] else None
        # The low factors' gradients through the factors, never forming the dense dL/dW:
        # tokens x (r - k) products instead of a rows x cols one (and its rows x cols x r uses).
        flat_grad = grad_out.reshape(-1, grad_out.shape[-1])
        flat_x = x.reshape(-1, x.shape[-1])
        x_v = flat_x @ v_low
        grad_u_side = flat_grad @ u_low
        grad_u = (flat_grad.mT @ x_v) * s_low
        grad_v = (flat_x.mT @ grad_u_side) * s_low
        grad_s = (x_v * grad_u_side).sum(0)
        grad_bias = flat_grad.sum(0) if ctx.needs_input_grad[7] else None
        return grad_x, None, None, None, grad_u, grad_s, grad_v, grad_bias


class OSFTLinear(nn.Module):
    """A linear layer stored as frozen top-k and trainable bottom r - k singular factors."""

    def __init__(self, in_features: int, out_features: int, frozen_rank: int, bias: bool,
                 device=None, dtype=None):  # fmt: skip
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        rank = min(in_features, out_features)
        self.frozen_rank, self.rank = frozen_rank, rank
        shapes = {
            "U_high": (out_features, frozen_rank),
            "S_high": (frozen_rank,),
            "V_high": (in_features, frozen_rank),
            "U_low": (out_features, rank - frozen_rank),
            "S_low": (rank - frozen_rank,),
            "V_low": (in_features, rank - frozen_rank),
        }
        for name, shape in shapes.items():
            tensor = torch.empty(shape, device=device, dtype=dtype)
            self.register_parameter(
                name, nn.Parameter(tensor, requires_grad=name not in FROZEN_FACTORS)
            )
        self.bias = (
            nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if (bias) else None
        )

    def forward(self, x: Tensor) -> Tensor:
        factors = [getattr(self, name) for name in FACTOR_NAMES]
        return _FactorizedLinear.apply(x, *factors, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"frozen_rank={self.frozen_rank}/{self.rank}, bias={self.bias is not None}"
        )
