"""The fp32 thin SVD of a target and its split into frozen (high) and trainable (low) factors.

A target W (rows x cols) with rank r = min(rows, cols) is W = U S Vᵀ. The top k singular
triplets are frozen (`U_high`, `S_high`, `V_high`), the other r - k train (`U_low`, `S_low`,
`V_low`). V is stored as cols x r (not Vᵀ), so both U and V are sharded by rows under FSDP2 and
one projection routine serves both sides.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

FACTOR_NAMES = ("U_high", "S_high", "V_high", "U_low", "S_low", "V_low")
FROZEN_FACTORS = ("U_high", "S_high", "V_high")
TRAINABLE_FACTORS = ("U_low", "S_low", "V_low")


def svd_device() -> torch.device:
    """Where SVDs run: the current GPU when there is one (much faster), else the CPU."""
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else (torch.device("cpu"))
    )


def thin_svd(weight: Tensor, device: torch.device | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(U rows x r, S r, V cols x r), fp32 on the CPU, singular values in descending order."""
    matrix = weight.detach().to(device or svd_device(), torch.float32)
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    return u.cpu().contiguous(), s.cpu().contiguous(), vh.mT.cpu().contiguous()


def frozen_rank(rank: int, frozen_fraction: float) -> int:
    """k = floor(frozen_fraction * rank), robust to float error (1 - 0.9 is 0.0999...)."""
    return min(rank, max(0, math.floor(frozen_fraction * rank + 1e-9)))


def split(u: Tensor, s: Tensor, v: Tensor, k: int) -> dict[str, Tensor]:
    """The six factors of a target with its top `k` triplets frozen."""
    return {
        "U_high": u[:, :k].contiguous(),
        "S_high": s[:k].contiguous(),
        "V_high": v[:, :k].contiguous(),
        "U_low": u[:, k:].contiguous(),
        "S_low": s[k:].contiguous(),
        "V_low": v[:, k:].contiguous(),
    }


def dense(factors: dict[str, Tensor]) -> Tensor:
    """W = U_high S_high V_highᵀ + U_low S_low V_lowᵀ, in fp32."""
    f = {name: factors[name].float() for name in FACTOR_NAMES}
    high = (f["U_high"] * f["S_high"]) @ f["V_high"].mT
    return torch.addmm(high, f["U_low"] * f["S_low"], f["V_low"].mT)
