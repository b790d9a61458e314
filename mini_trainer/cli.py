"""The `mini-trainer` command: one subcommand per pipeline step.

Heavy imports (torch, transformers) happen inside each subcommand, so `--help` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path

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


@cli.command("demo-assets")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to create; gets model/ and data/.",
)
@click.option("--seed", default=0, show_default=True, help="Seeds tokenizer, weights and data.")
@click.option("--force", is_flag=True, help="Replace existing model/ and data/ folders.")
def demo_assets(out: Path, seed: int, force: bool) -> None:
    """Build the offline demo: a tiny Llama, a local BPE tokenizer and synthetic tasks.

    Writes OUT/model/ (loadable with AutoModelForCausalLM / AutoTokenizer) and
    OUT/data/<task>.{train,eval}.jsonl in the pre-tokenized format. Deterministic:
    the same seed gives byte-identical files.
    """
    from mini_trainer.demo.assets import DemoSpec, build_demo_assets

    counts = build_demo_assets(out, DemoSpec(seed=seed), overwrite=force)
    click.echo(f"wrote {out / 'model'}")
    for name, count in counts.items():
        click.echo(f"wrote {out / 'data' / name}.jsonl ({count} samples)")


def main() -> None:
    cli(prog_name="mini-trainer")
