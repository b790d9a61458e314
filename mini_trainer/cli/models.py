"""Model subcommands: resolve a Hub id to a local folder, cache OSFT's SVD factors."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mini_trainer.cli.group import cli
from mini_trainer.cli.options import (
    force_option,
    model_options,
    out_option,
    resolve_model_option,
)
from mini_trainer.data.outputs import check_writable
from mini_trainer.io_utils import atomic_write_text
from mini_trainer.log_setup import setup_logging
from mini_trainer.models.hub import resolve_model as resolve


@cli.command("resolve-model")
@model_options("Model to resolve.")
@out_option(
    "JSON to write: folder, Hub id, revision and commit (the pipeline's model record).",
    required=False,
)
def resolve_model(model: str, model_revision: str, out: Path | None) -> None:
    """Fetch a Hub model into the Hugging Face cache (or find it there) and print its folder.

    Fetches what training needs only (config, tokenizer, safetensors weights); run it on a host
    with network access to fill the cache that offline jobs (HF_HUB_OFFLINE=1) read. A local
    folder is printed as it is. The JSON is written only if it would change, so a pipeline
    reruns its downstream steps only when the commit does.
    """
    if out is not None:  # before any download
        check_writable(out.parent, "--out")
    resolved = resolve(model, model_revision)
    commit = f" (commit {resolved.commit})" if resolved.commit else ""
    click.echo(f"{model}: {resolved.folder}{commit}")
    if out is not None:
        text = json.dumps({"model": model, **resolved.record()}, indent=2) + "\n"
        if not out.is_file() or out.read_text() != text:
            atomic_write_text(out, text)
            click.echo(f"wrote {out}")


@cli.command("osft-svd")
@model_options("Model (safetensors weights) whose targeted weights are factorized.")
@out_option("Cache folder to write: factors-*.safetensors and meta.json.", folder=True)
@click.option(
    "--target-patterns",
    multiple=True,
    help="Substring of the parameter names to factorize (repeat it, or separate by commas); "
    "default: the q/k/v/o and gate/up/down projections. Must equal train's "
    "--osft-target-patterns.",
)
@force_option("Replace an existing cache folder.")
def osft_svd(
    model: str, model_revision: str, out: Path, target_patterns: tuple[str, ...], force: bool
) -> None:
    """Compute the fp32 thin SVD of every OSFT target of MODEL once, for any unfreeze ratio.

    `train --osft --osft-svd-cache OUT` then loads the factors instead of computing them; it
    refuses a cache whose weights hash, patterns or shapes do not match, or whose files are
    truncated or corrupt. Under torchrun the targets are split over the ranks; SVDs run on the
    GPU when there is one. OUT appears complete or not at all.
    """
    # deferred: torch, transformers
    from mini_trainer.osft.build import build_cache

    setup_logging()
    patterns = [p for value in target_patterns for p in value.split(",") if p] or None
    meta = build_cache(resolve_model_option(model, model_revision), out, patterns, force)
    if meta is not None:
        size = sum(record["bytes"] for record in meta["files"].values())
        click.echo(f"wrote {out}: {len(meta['targets'])} targets, {size / 1024**2:.1f} MiB")
