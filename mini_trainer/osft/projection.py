"""Keeping the trainable factors orthogonal to the frozen ones, also when FSDP2 shards them.

For every target, U_low must stay orthogonal to U_high and V_low to V_high: then
U_highᵀ ΔW = 0 and ΔW V_high = 0 for any change of the low factors, i.e. the update never
enters the frozen subspace. A side keeps either U_high (project off it: x - B Bᵀ x) or, where
that is the same and cheaper, the basis of the complement (project onto it: B Bᵀ x); see
`svd.basis_name`. Gradients are projected before the optimizer step (so AdamW's
moments hold no frozen-subspace component) and, because AdamW's per-element scaling and weight
decay move the factors off the projected direction anyway, the parameters are projected again
after the step. That second projection is what makes the invariant exact.

Under FSDP2 every factor is a DTensor sharded by rows (dim 0). `highᵀ low` is a sum over rows,
so each rank multiplies its local rows and one all-reduce (for all targets at once) completes
the sums; `low -= high @ (highᵀ low)` is then local to each rank's rows. A mixture of experts'
factors are 3-D (experts, rows, r): FSDP2 shards them by experts, so each rank holds whole
experts and their products need no all-reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Shard


def _local(tensor: Tensor) -> tuple[Tensor, object]:
    """(the rows this rank holds, the process group to sum over or None)."""
    if isinstance(tensor, DTensor):
        sharded = any(isinstance(p, Shard) for p in tensor.placements)
        group = tensor.device_mesh.get_group() if sharded else None
        return tensor.to_local(), group
    return tensor, None


@torch.no_grad()
def remove_frozen_components(pairs: list[tuple[Tensor, Tensor, bool]]) -> None:
    """For each (x, basis B, onto): x <- B (Bᵀ x) if onto else x - B (Bᵀ x), in place.

    One all-reduce for all pairs. `x` and `B` are row-sharded alike (same row count, so FSDP2
    splits them the same way).
    """
    work = []
    for low, basis, onto in pairs:
        low_local, group = _local(low)
        basis_local, _ = _local(basis)
        if low_local.shape[-1] == 0 or (basis_local.shape[-1] == 0 and not onto):
            continue
        if low_local.dim() == 3:  # experts: whole matrices on each rank
            group = None
        work.append((low_local, basis_local, onto, group))
    if not work:
        return
    coefficients = [basis.mT @ low for low, basis, _, _ in work]
    summed = [i for i, (*_, g) in enumerate(work) if g is not None]
    group = work[summed[0]][3] if summed else None
    if group is not None and dist.get_world_size(group) > 1:
        shapes = [coefficients[i].shape for i in summed]
        flat = torch.cat([coefficients[i].reshape(-1) for i in summed])
        dist.all_reduce(flat, group=group)
        parts = flat.split([coefficients[i].numel() for i in summed])
        for i, part, shape in zip(summed, parts, shapes, strict=True):
            coefficients[i] = part.view(shape)
    for (low, basis, onto, _), coefficient in zip(work, coefficients, strict=True):
        inside = basis @ coefficient.to(low.dtype)
        if onto:
            low.copy_(inside)
        else:
            low.sub_(inside)
