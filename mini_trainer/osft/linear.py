"""The factorized linear layer that stands in for a target weight during training.

W = W_high + U_low S_low V_lowᵀ. W_high (the frozen top-k part, dense) and one frozen basis per
side (for the projections, see `svd.basis_name`) are frozen parameters (FSDP2 shards them like
any other); only the low factors train. The forward adds the r - k trainable triplets to W_high
and runs one dense matmul: one rows x cols x (r - k) product per call, independent of the
number of tokens, instead of rebuilding W from all r triplets (4x the work at u = 0.25). The
backward adds them again (for the input's gradient) rather than keeping W from the forward, so
no layer holds a second dense weight between its forward and its backward. The low factors'
gradients go through the factors (tokens x (r - k) products), never through a dense dL/dW. The
bases take no part in the forward: only the projections (`projection.py`) use them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mini_trainer.osft.svd import (
    TRAINABLE_FACTORS,
    basis_name,
    compose,
    part_shapes,
    projection_pairs,
)


class _FactorizedLinear(torch.autograd.Function):
    """y = x Wᵀ + b with W = W_high + U_low S_low V_lowᵀ; gradients for x, the low factors, b."""

    @staticmethod
    def forward(ctx, x, w_high, u_low, s_low, v_low, bias):
        ctx.save_for_backward(x, w_high, u_low, s_low, v_low)
        return F.linear(x, compose(w_high, u_low, s_low, v_low), bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, w_high, u_low, s_low, v_low = ctx.saved_tensors
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_out @ compose(w_high, u_low, s_low, v_low)
        # The low factors' gradients through the factors, never forming the dense dL/dW:
        # tokens x (r - k) products instead of a rows x cols one (and its rows x cols x r uses).
        flat_grad = grad_out.reshape(-1, grad_out.shape[-1])
        flat_x = x.reshape(-1, x.shape[-1])
        x_v = flat_x @ v_low
        grad_u_side = flat_grad @ u_low
        grad_u = (flat_grad.mT @ x_v) * s_low
        grad_v = (flat_x.mT @ grad_u_side) * s_low
        grad_s = (x_v * grad_u_side).sum(0)
        grad_bias = flat_grad.sum(0) if ctx.needs_input_grad[5] else None
        return grad_x, None, grad_u, grad_s, grad_v, grad_bias


class OSFTLinear(nn.Module):
    """A linear layer stored as its frozen top-k part and trainable bottom r - k factors."""

    def __init__(self, in_features: int, out_features: int, frozen_rank: int, bias: bool,
                 device=None, dtype=None):  # fmt: skip
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        rank = min(in_features, out_features)
        self.frozen_rank, self.rank = frozen_rank, rank
        self.u_basis = basis_name("U", out_features, rank, frozen_rank)
        self.v_basis = basis_name("V", in_features, rank, frozen_rank)
        for name, shape in part_shapes(out_features, in_features, frozen_rank).items():
            tensor = torch.empty(shape, device=device, dtype=dtype)
            self.register_parameter(
                name, nn.Parameter(tensor, requires_grad=name in TRAINABLE_FACTORS)
            )
        self.bias = (
            nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if (bias) else None
        )

    @property
    def dense_weight_numel(self) -> int:
        """The dense weight this layer stands for, as model FLOPs count it (`training/flops.py`):
        W_high, the low factors and the bases are how it is stored, not what a token costs."""
        return self.in_features * self.out_features

    def forward(self, x: Tensor) -> Tensor:
        return _FactorizedLinear.apply(
            x, self.W_high, self.U_low, self.S_low, self.V_low, self.bias
        )

    def projection_pairs(self, gradients: bool) -> list[tuple[Tensor, Tensor, bool]]:
        """(U_low or its gradient, its side's basis, whether to project onto the basis), for V too.

        A `*_high` basis is projected off (x - B Bᵀ x), a `*_low_init` one onto (B Bᵀ x).
        """
        return projection_pairs(self, gradients)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"frozen_rank={self.frozen_rank}/{self.rank}, bias={self.bias is not None}"
        )
