"""The context-parallel groups of a run (`--context-parallel N`): a dp x cp device mesh.

Ranks r = dp * N + cp: consecutive ranks form a group, so on a node of 8 GPUs with N <= 8 a
group's all-gathers stay inside the node. Only the cp dimension gets collectives of its own
(attention's key/value gather); FSDP2 shards and reduces gradients over the whole world, which
is exact (every rank's gradient is a sum over its own chunk's tokens, each token counted on one
rank) and keeps checkpoints, export and resume exactly as without CP.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import init_device_mesh

from mini_trainer.distributed.runtime import Runtime
from mini_trainer.errors import UserError


@dataclass(frozen=True)
class ContextGroups:
    """This rank's place in the dp x cp mesh."""

    size: int
    """N: ranks per context-parallel group."""
    rank: int
    """This rank's place in its group (which zig-zag chunk it takes)."""
    dp_rank: int
    """Which group: the index the batch plan's rows are for."""
    dp_size: int
    """Number of groups (world size / N): the ranks the sampler and packer plan for."""
    group: object
    """The group's process group (attention's all-gather)."""


def mesh_position(rank: int, world_size: int, size: int) -> tuple[int, int]:
    """(dp rank, cp rank) of global `rank`; a UserError when N does not divide the world."""
    if size < 1 or world_size % size:
        raise UserError(
            f"--context-parallel {size}: the number of ranks ({world_size}) must be a multiple "
            "of it"
        )
    return rank // size, rank % size


def context_groups(runtime: Runtime, size: int) -> ContextGroups | None:
    """The run's groups (every rank must call this, in the same order); None for N = 1."""
    dp_rank, cp_rank = mesh_position(runtime.rank, runtime.world_size, size)
    if size == 1:
        return None
    mesh = init_device_mesh(
        runtime.device.type, (runtime.world_size // size, size), mesh_dim_names=("dp", "cp")
    )
    if (mesh.get_local_rank("dp"), mesh.get_local_rank("cp")) != (dp_rank, cp_rank):
        raise RuntimeError("device mesh placed this rank elsewhere than mesh_position (a bug)")
    return ContextGroups(size, cp_rank, dp_rank, runtime.world_size // size, mesh.get_group("cp"))
