"""The `mini-trainer` click group, and how a `UserError` becomes one line and an exit status."""

from __future__ import annotations

import sys

import click

from mini_trainer import __version__
from mini_trainer.errors import UserError


class _Group(click.Group):
    """Turns a `UserError` into its lines on stderr and its exit status, with no traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as error:
            for line in error.lines:
                click.echo(f"error: {line}", err=True)
            sys.exit(error.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mini-trainer")
def cli() -> None:
    """Fast full fine-tuning of causal LMs, with OSFT for continual learning.

    Each subcommand is one step of the pipeline; `snakemake --cores N` runs them all.
    """
