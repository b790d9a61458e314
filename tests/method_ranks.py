"""Run under torchrun (2 ranks): several training jobs one after another in the same processes
(`mini_trainer.train.main`, each with its own process group), so that one launch checks more
than one method on two ranks (tests/test_methods.py: EWC's penalty and LwF's KL).

`python -m torch.distributed.run --standalone --nproc-per-node 2 tests/method_ranks.py JOBS`:
JOBS is a JSON file holding a list of flag lists. The exit status is the first failed job's.

Each job after the first meets its peers through a store of its own: after
`destroy_process_group` torch names the next default group "0" again, and torchrun's agent
store still holds the previous job's gloo addresses under that name, so a rank that starts the
next job first could read its peer's stale address and wait forever (it did, in one launch of
three). Rank 0 picks a free port and hands it over through the agent store.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

from torch.distributed import TCPStore

from mini_trainer.train import main

AGENT = (os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0")))
"""torchrun's agent store, where the ranks agree on each later job's port."""


def fresh_rendezvous(job: int) -> None:
    """Point this rank's env:// rendezvous at a new store for job `job` (every rank alike)."""
    agent = TCPStore(*AGENT, is_master=False, timeout=timedelta(minutes=5))
    key = f"method_ranks/port/{job}"
    if os.environ["RANK"] == "0":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        agent.set(key, str(port))
    port = int(agent.get(key))
    os.environ.update(MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="False")


def run(jobs: str) -> int:
    for job, flags in enumerate(json.loads(Path(jobs).read_text())):
        if job:
            fresh_rendezvous(job)
        status = main(flags)
        if status:
            return status
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
