"""The one logging set-up of a `mini-trainer` process (the package logs to "mini_trainer").

A worker of a distributed job prefixes each line with its rank and the time, and shows INFO on
rank 0 only (warnings on every rank), so N ranks do not print N copies of the same progress; a
plain one-process command prints its messages alone.
"""

from __future__ import annotations

import logging


def setup_logging(rank: int | None = None) -> None:
    """Configure the root logger once per process: as rank `rank` of a job, or (None) as a
    plain command."""
    if rank is None:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        return
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"[rank{rank}] %(asctime)s %(message)s",
        datefmt="%H:%M:%S",
    )
