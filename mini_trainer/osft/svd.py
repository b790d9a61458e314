"""The fp32 thin SVD of a target and its split into frozen (high) and trainable (low) factors.

A target W (rows x cols) with rank r = min(rows, cols) is W = U S Vᵀ. The top k singular
triplets are frozen, the other r - k train (`U_low`, `S_low`, `V_low`). The frozen part is kept
densely, as `W_high` = W - U_low S_low V_lowᵀ, so that a forward adds only the r - k trainable
triplets to it instead of rebuilding all r.

The projections that keep U_low off the frozen U_high (and V_low off V_high) need, per side, a
frozen basis. Which one is a matter of cost: projecting off U_high (rows x k) costs rows x k x
(r - k) per factor. When the side is full (rows == r, e.g. both sides of a square target),
"orthogonal to U_high" is the same as "inside the span of the other r - k left singular
vectors", so the side can keep `U_low_init` (U_low as it started, rows x (r - k)) and project
onto it instead: rows x (r - k)² work and memory, cheaper when r - k < k (u < 0.5). On a long
side (rows > r) the complement of U_high is larger than any stored basis, so it keeps U_high.
`basis_name` decides, from the shape alone, so the model and its state always agree.

V is stored as cols x r (not Vᵀ), so both U and V are sharded by rows under FSDP2 and one
projection routine serves both sides.

A mixture of experts' fused weight (E x rows x cols) is E such targets at once: every function
here takes a leading experts dimension (`..., rows, cols`), and each expert is split by its own
SVD with the same k.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

TRAINABLE_FACTORS = ("U_low", "S_low", "V_low")
DENSE_PARTS = ("W_high", "U_low", "S_low", "V_low")
"""What the dense weight is made of: W = W_high + U_low S_low V_lowᵀ."""
PART_NAMES = ("W_high", "U_high", "U_low_init", "V_high", "V_low_init", *TRAINABLE_FACTORS)
"""Every name a factorized target's parameters can have (each target has six of them)."""


def svd_device() -> torch.device:
    """Where SVDs run: the current GPU when there is one (much faster), else the CPU."""
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else (torch.device("cpu"))
    )


def thin_svd(weight: Tensor, device: torch.device | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(U rows x r, S r, V cols x r), fp32 on the CPU, singular values in descending order;
    per expert for a (E, rows, cols) weight."""
    matrix = weight.detach().to(device or svd_device(), torch.float32)
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    return u.cpu().contiguous(), s.cpu().contiguous(), vh.mT.cpu().contiguous()


def frozen_rank(rank: int, frozen_fraction: float) -> int:
    """k = floor(frozen_fraction * rank), robust to float error (1 - 0.9 is 0.0999...)."""
    return min(rank, max(0, math.floor(frozen_fraction * rank + 1e-9)))


def basis_name(side: str, dim: int, rank: int, k: int) -> str:
    """The frozen basis one side ("U": dim = rows, "V": dim = cols) keeps for its projection."""
    return f"{side}_low_init" if dim == rank and rank - k < k else f"{side}_high"


def projection_pairs(module, gradients: bool) -> list[tuple[Tensor, Tensor, bool]]:
    """(`U_low` or its gradient, its side's basis buffer, whether to project onto the basis),
    then the same for `V_low`, of an `OSFTLinear` or an expert weight (2-D or 3-D alike): what
    `projection.py` projects. A side without a gradient is left out."""
    pairs = []
    for low, basis in ((module.U_low, module.u_basis), (module.V_low, module.v_basis)):
        tensor = low.grad if gradients else low
        if tensor is not None:
            pairs.append((tensor, getattr(module, basis), basis.endswith("_low_init")))
    return pairs


def part_shapes(rows: int, cols: int, k: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the six parameters of a target with k of its r triplets frozen."""
    rank = min(rows, cols)
    u_basis, v_basis = basis_name("U", rows, rank, k), basis_name("V", cols, rank, k)
    width = {"U_high": k, "V_high": k, "U_low_init": rank - k, "V_low_init": rank - k}
    return {
        "W_high": (rows, cols),
        u_basis: (rows, width[u_basis]),
        v_basis: (cols, width[v_basis]),
        "U_low": (rows, rank - k),
        "S_low": (rank - k,),
        "V_low": (cols, rank - k),
    }


def split(weight: Tensor, u: Tensor, s: Tensor, v: Tensor, k: int) -> dict[str, Tensor]:
    """The parameters of `weight` = U S Vᵀ with its top `k` triplets frozen (`part_shapes`).

    W_high is the weight less its trainable part, not U_high S_high V_highᵀ: it costs
    rows x cols x (r - k) instead of x k, and the model starts from the weight itself, not
    from its rebuild (which differs by the SVD's rounding).
    """
    low = {
        "U_low": u[..., k:].contiguous(),
        "S_low": s[..., k:].contiguous(),
        "V_low": v[..., k:].contiguous(),
    }
    weight = weight.to(u.device, torch.float32)
    parts = {"W_high": compose(weight, low["U_low"], -low["S_low"], low["V_low"]), **low}
    shapes = part_shapes(u.shape[-2], v.shape[-2], k)
    for name in shapes.keys() - parts.keys():  # the two bases: a copy, never a view of U_low
        side = u if name.startswith("U") else v
        basis = side[..., :k] if name.endswith("_high") else side[..., k:]
        parts[name] = basis.clone(memory_format=torch.contiguous_format)
    return {name: parts[name] for name in shapes}


def compose(w_high: Tensor, u_low: Tensor, s_low: Tensor, v_low: Tensor) -> Tensor:
    """W_high + U_low diag(S_low) V_lowᵀ: the layer's weight from its parts (per expert for
    3-D parts)."""
    if w_high.dim() == 3:
        return torch.baddbmm(w_high, u_low * s_low.unsqueeze(-2), v_low.mT)
    return torch.addmm(w_high, u_low * s_low, v_low.mT)


def dense(factors: dict[str, Tensor]) -> Tensor:
    """W = W_high + U_low S_low V_lowᵀ, in fp32."""
    return compose(*(factors[name].float() for name in DENSE_PARTS))
