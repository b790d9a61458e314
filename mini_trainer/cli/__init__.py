"""The `mini-trainer` command: one subcommand per pipeline step.

Heavy imports (torch, transformers) happen inside the subcommands that need them (each marked
`# deferred:`), so `--help` and the light commands stay fast.
"""

from __future__ import annotations

# Each module registers its subcommands on the group when imported.
from mini_trainer.cli import data, methods, models, results, trace, training  # noqa: F401
from mini_trainer.cli.group import cli

__all__ = ["cli", "main"]


def main() -> None:
    cli(prog_name="mini-trainer")
