"""Who this process is in the job, read from torchrun's environment variables without torch:
the one reader of `RANK`, `LOCAL_RANK` and `WORLD_SIZE`, for the light paths (the CLI's
rank-0 printing, the Hub download lock, OSFT's cache) and for `runtime.init_runtime`."""

from __future__ import annotations

import os


def env_world() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's variables; a lone process is rank 0 of 1."""
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return rank, local_rank, world_size
