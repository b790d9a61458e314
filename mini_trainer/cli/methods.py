"""Subcommands of the continual-learning methods: EWC's Fisher, weight interpolation."""

from __future__ import annotations

from pathlib import Path

import click

from mini_trainer.cli.group import cli
from mini_trainer.cli.options import EXISTING_FILE, force_option, out_option
from mini_trainer.data.outputs import check_writable
from mini_trainer.errors import UserError
from mini_trainer.log_setup import setup_logging

MODEL_FOLDER = click.Path(exists=True, file_okay=False, path_type=Path)


def _refuse_existing(out: Path, force: bool) -> None:
    """Nothing a user made is overwritten without --force, and an unwritable location is one
    line before any work."""
    if out.exists() and not force:
        raise UserError(f"--out {out}: exists (pass --force to replace it)")
    check_writable(out.parent, "--out")


@cli.command("ewc-fisher")
@click.option("--model", required=True, type=MODEL_FOLDER,
              help="The stage's final weights (a local folder): the anchor.")  # fmt: skip
@click.option("--data", required=True, type=EXISTING_FILE,
              help="The stage's pre-tokenized training JSONL (input_ids, labels).")  # fmt: skip
@out_option("Folder to write: fisher.safetensors, anchor.safetensors, meta.json.", folder=True)
@click.option("--previous", type=MODEL_FOLDER, default=None,
              help="The previous stage's ewc-fisher folder (online EWC: gamma * its Fisher is "
              "added).")  # fmt: skip
@click.option("--gamma", type=click.FloatRange(0, 1), default=1.0, show_default=True,
              help="Online EWC: weight of the previous stages' Fisher.")  # fmt: skip
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True,
              help="Samples per mini-batch of the estimate.")  # fmt: skip
@click.option("--max-samples", type=click.IntRange(min=1), default=None,
              help="Use only the first N samples [default: all].")  # fmt: skip
@force_option("Replace an existing folder.")
def ewc_fisher(model: Path, data: Path, out: Path, previous: Path | None, gamma: float,
               batch_size: int, max_samples: int | None, force: bool) -> None:  # fmt: skip
    """Diagonal Fisher of DATA at MODEL's weights, for `train --method ewc --ewc-fisher OUT`.

    Estimator: squared gradients of mini-batch mean losses, averaged over the mini-batches (as
    TRACE and Avalanche compute it); one process, on the CPU. OUT also keeps the weights
    (the anchor) and checksums; training refuses a folder whose files or model do not match.
    """
    # deferred: torch, transformers
    from mini_trainer.ewc.fisher import build_fisher

    setup_logging()
    _refuse_existing(out, force)
    meta = build_fisher(
        model, data, out, previous=previous, gamma=gamma, batch_size=batch_size,
        max_samples=max_samples,
    )  # fmt: skip
    click.echo(
        f"wrote {out}: {meta['parameters']} parameters, {meta['batches']} mini-batches, "
        f"stage {meta['stages']} (gamma {gamma:g})"
    )


@cli.command("interpolate")
@click.option("--previous", required=True, type=MODEL_FOLDER,
              help="The weights the stage started from (alpha 0).")  # fmt: skip
@click.option("--new", "new", required=True, type=MODEL_FOLDER,
              help="The stage's final weights (alpha 1).")  # fmt: skip
@click.option("--alpha", required=True, type=float,
              help="Share of the new weights, 0 to 1.")  # fmt: skip
@out_option("Model folder to write.", folder=True)
@force_option("Replace an existing folder.")
def interpolate_command(previous: Path, new: Path, alpha: float, out: Path, force: bool) -> None:
    """Write (1 - ALPHA) * PREVIOUS + ALPHA * NEW as a model folder (WiSE-FT; no training).

    Blended in fp32, stored in NEW's dtype and file layout; alpha 1 is NEW bit for bit.
    """
    # deferred: torch
    from mini_trainer.models.interpolate import interpolate

    _refuse_existing(out, force)
    interpolate(previous, new, alpha, out)
    click.echo(f"wrote {out}: alpha {alpha:g}")
