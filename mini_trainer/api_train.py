"""Programmatic training: `run_training(TorchrunArgs(...), TrainingArgs(...))`.

It runs `mini-trainer train --nproc-per-node N ...` in a child process, so it takes the one
launch path (`train.launch`: the flags checked once, then torchrun's elastic agent,
distributed/launcher.py). Every `TrainingArgs` field becomes its flag by `to_cli_args`; the
job's output is streamed, and a failed job raises with the output's tail and the job's
documented exit status (2 user error, 3 diverged, 75 stopped with a state saved, 1 other).
"""

from __future__ import annotations

import collections
import subprocess
import sys

from mini_trainer.launch_args import TorchrunArgs
from mini_trainer.training_args import TrainingArgs, to_cli_args

TAIL_LINES = 40


class TrainingFailed(RuntimeError):
    """The training job exited non-zero; `returncode` and `tail` (last output lines) tell why."""

    def __init__(self, returncode: int, tail: list[str]):
        self.returncode = returncode
        self.tail = tail
        super().__init__(
            f"training failed with exit status {returncode}; last output:\n" + "".join(tail)
        )


def build_command(torchrun_args: TorchrunArgs, training_args: TrainingArgs) -> list[str]:
    """The launcher command line for these arguments."""
    return [
        sys.executable, "-m", "mini_trainer", "train",
        *torchrun_args.launcher_cli_args(),
        *to_cli_args(training_args),
    ]  # fmt: skip


def run_training(torchrun_args: TorchrunArgs, training_args: TrainingArgs, echo=True) -> None:
    """Run the training job to completion; raise `TrainingFailed` if it fails.

    The job's output is streamed line by line to stdout (unless `echo` is false).
    """
    command = build_command(torchrun_args, training_args)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line)
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
    if process.returncode != 0:
        raise TrainingFailed(process.returncode, list(tail))
