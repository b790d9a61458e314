"""Run under torchrun (2 ranks): several training jobs one after another in the same processes
(`mini_trainer.train.main`, each with its own process group), so that one launch checks more
than one method on two ranks (tests/test_methods.py: EWC's penalty and LwF's KL).

`python -m torch.distributed.run --standalone --nproc-per-node 2 tests/method_ranks.py JOBS`:
JOBS is a JSON file holding a list of flag lists. The exit status is the first failed job's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mini_trainer.train import main


def run(jobs: str) -> int:
    for flags in json.loads(Path(jobs).read_text()):
        status = main(flags)
        if status:
            return status
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
