"""SIGTERM / SIGINT / SIGUSR1: finish the step, save a state, exit with `EXIT_PREEMPTED`.

Slurm sends SIGTERM before it kills a job (and SIGUSR1 with `--signal=USR1@<seconds>`), Ctrl-C
sends SIGINT; the handler only records the signal, and the training loop acts on it between
optimizer steps so the saved state is consistent on every rank.
"""

from __future__ import annotations

import signal

EXIT_PREEMPTED = 75
"""Exit status after a signal-triggered state save (EX_TEMPFAIL: run again with --resume)."""


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
"""Signals that ask a run to stop after the step in progress, with a state saved."""


class StopRequest:
    """Records the first SIGTERM, SIGINT or SIGUSR1 received by this process."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handle)

    def _handle(self, signum, _frame) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name

    @property
    def requested(self) -> bool:
        return self.signal_name is not None
