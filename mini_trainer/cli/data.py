"""Data subcommands: build the demo, check, split, tokenize and mix JSONL datasets."""

from __future__ import annotations

from pathlib import Path

import click

from mini_trainer.cli.group import cli
from mini_trainer.cli.options import (
    EXISTING_FILE,
    FILE,
    force_option,
    max_tokens_option,
    model_options,
    on_long_option,
    out_option,
    resolve_model_option,
    seed_option,
)
from mini_trainer.data.mix import REPLAY, WEIGHT, MixInput, write_mix
from mini_trainer.data.mix import check_inputs as check_mix_inputs
from mini_trainer.data.outputs import check_outputs
from mini_trainer.data.split import split_validation as split
from mini_trainer.data.tokenize import load_chat_tokenizer, tokenize_jsonl, tokenizer_warnings
from mini_trainer.data.validate import build_index, read_vocab_size, summary_text, write_index
from mini_trainer.models.hub import hub_source


@cli.command("demo-assets")
@out_option("Folder to create; gets model/ and data/.", folder=True)
@seed_option("Seeds tokenizer, weights and data.")
@force_option("Replace existing model/ and data/ folders.")
def demo_assets(out: Path, seed: int, force: bool) -> None:
    """Build the offline demo: a tiny Llama, a local BPE tokenizer and synthetic tasks.

    Writes OUT/model/ (loadable with AutoModelForCausalLM / AutoTokenizer) and
    OUT/data/<task>.{train,eval}.jsonl in the pre-tokenized format. Deterministic:
    the same seed gives byte-identical files.
    """
    # deferred: torch, transformers (the demo's model and tokenizer)
    from mini_trainer.demo.assets import DemoSpec, build_demo_assets

    counts = build_demo_assets(out, DemoSpec(seed=seed), overwrite=force)
    click.echo(f"wrote {out / 'model'}")
    for name, count in counts.items():
        click.echo(f"wrote {out / 'data' / name}.jsonl ({count} samples)")


@cli.command("validate")
@click.argument("data", type=EXISTING_FILE)
@model_options("Model; only its config.json is read (for the vocabulary size).")
@max_tokens_option("Token cap per micro-batch; a longer sample can never be trained on.")
@out_option(
    "Parquet index to write: line, byte offset, bytes, len, loss tokens per sample.",
    name="--out-index",
)
@out_option(
    "JSON summary to write: counts, tokens, length percentiles, vocabulary size.",
    name="--out-summary",
)
@on_long_option(
    "What a sample longer than --max-tokens-per-gpu is: an error, or dropped and counted."
)
# Kept alike on purpose: click option blocks share one shape; each is its own flag.
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Processes that check the file [default: the usable CPUs, at most 8].",
)
@force_option("Replace existing index and summary files.")
def validate(
    data: Path,
    model: str,
    model_revision: str,
    max_tokens_per_gpu: int,
    out_index: Path,
    out_summary: Path,
    on_long: str,
    workers: int | None,
    force: bool,
) -> None:
    """Check every line of the pre-tokenized JSONL file DATA and write its lengths index.

    Each line must be {"input_ids": [...], "labels": [...], "len": N} (len optional) with
    integer token ids below the model's vocabulary size, labels of -100 or a token id, the
    same length for both lists and at least one loss token after the causal shift. The file
    is streamed in constant memory. Every problem is printed as FILE:LINE: FIELD: reason
    (the first 50, then the total); on any problem the exit status is 2 and neither output
    is written. A progress bar appears when stderr is a terminal.
    """
    check_outputs({"--out-index": out_index, "--out-summary": out_summary}, [data], force)
    folder = resolve_model_option(model, model_revision, weights=False)
    vocab_size = read_vocab_size(folder)
    index, summary = build_index(
        data, vocab_size, max_tokens_per_gpu, on_long=on_long, workers=workers
    )
    summary["model"] = str(model)
    if source := hub_source(folder):
        summary["model_commit"] = source["commit"]
    write_index(index, summary, out_index, out_summary)
    click.echo(summary_text(summary))
    click.echo(f"wrote {out_index}")
    click.echo(f"wrote {out_summary}")


@cli.command("split-validation")
@click.argument("data", type=EXISTING_FILE)
@click.option(
    "--fraction",
    required=True,
    type=float,
    help="Share of DATA's samples (not blank, not in --exclude) that become validation samples.",
)
@seed_option("Which samples are drawn.", default=42)
@click.option(
    "--exclude",
    type=EXISTING_FILE,
    default=None,
    help="An eval JSONL: a sample with the same input_ids is never drawn for validation.",
)
@out_option("DATA without the drawn samples.", name="--out-train")
@out_option("The drawn samples.", name="--out-validation")
@force_option("Replace existing output files.")
def split_validation(
    data: Path,
    fraction: float,
    seed: int,
    exclude: Path | None,
    out_train: Path,
    out_validation: Path,
    force: bool,
) -> None:
    """Split a validation set off the pre-tokenized JSONL DATA, deterministically by --seed.

    Lines are copied unchanged and in order; check both outputs with `validate`.
    """
    inputs = [data, *([exclude] if exclude else [])]
    check_outputs({"--out-train": out_train, "--out-validation": out_validation}, inputs, force)
    kept, drawn = split(data, fraction, seed, out_train, out_validation, exclude)
    click.echo(f"wrote {out_train} ({kept} lines) and {out_validation} ({drawn} lines)")


@cli.command("tokenize")
@click.argument("in_path", metavar="IN", type=EXISTING_FILE)
@model_options("Model with the tokenizer and its chat template.")
@out_option("Pre-tokenized JSONL to write.")
@click.option(
    "--max-len",
    type=click.IntRange(min=1),
    default=None,
    help="Longest conversation in tokens (default: no limit). Longer ones are never truncated.",
)
@on_long_option("What a conversation longer than --max-len is: an error, or left out and counted.")
@force_option("Replace an existing output file.")
def tokenize(
    in_path: Path,
    model: str,
    model_revision: str,
    out: Path,
    max_len: int | None,
    on_long: str,
    force: bool,
) -> None:
    """Tokenize the chat JSONL file IN with the model's chat template.

    Each input line is {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}]}.
    Each output line is {"input_ids": [...], "labels": [...], "len": N}, with loss (labels
    equal to the ids) only on assistant content and its end-of-turn token, -100 elsewhere.
    Every problem is printed as FILE:LINE: FIELD: reason; on any problem the exit status is 2
    and OUT is not written.
    """
    check_outputs({"--out": out}, [in_path], force)
    model = resolve_model_option(model, model_revision, weights=False)
    vocab_size = read_vocab_size(model)
    tokenizer = load_chat_tokenizer(model)
    for warning in tokenizer_warnings(tokenizer):
        click.echo(f"warning: {warning}", err=True)
    result = tokenize_jsonl(
        tokenizer, in_path, out, max_len=max_len, on_long=on_long, vocab_size=vocab_size
    )
    dropped = f", {result.dropped:,} dropped (longer than {max_len})" if result.dropped else ""
    samples = f"{result.samples:,} sample{'s' if result.samples != 1 else ''}"
    click.echo(
        f"wrote {out}: {samples}{dropped}, {result.tokens:,} tokens, "
        f"{result.loss_tokens:,} loss tokens"
    )


@cli.command("mix")
@click.option(
    "--input",
    "weighted",
    multiple=True,
    type=(FILE, float),
    metavar="FILE WEIGHT",
    help="A JSONL file and its weight (its share of the output); the first one's samples all "
    "appear once.",
)
# Kept alike on purpose: click option blocks share one shape; each is its own flag.
@click.option(
    "--replay",
    multiple=True,
    type=(FILE, float),
    metavar="FILE FRACTION",
    help="A JSONL file and the fraction (0..1) of its samples to add, without replacement.",
)
@seed_option("Seeds which samples are chosen.")
@out_option("Mixed JSONL.")
@out_option("JSON saying which (input, line) each output line is.", name="--out-sidecar")
@click.option("--oversample", is_flag=True, help="Allow a weight to repeat a file's samples.")
@force_option("Replace existing output files.")
def mix(
    weighted: tuple[tuple[Path, float], ...],
    replay: tuple[tuple[Path, float], ...],
    seed: int,
    out: Path,
    out_sidecar: Path,
    oversample: bool,
    force: bool,
) -> None:
    """Mix JSONL datasets by weight, plus replayed fractions, into one file (docs/data.md).

    Deterministic for a seed; lines are copied unchanged (validate the result before training).
    """
    inputs = [MixInput(p, WEIGHT, w) for p, w in weighted]
    inputs += [MixInput(p, REPLAY, f) for p, f in replay]
    check_mix_inputs(inputs)
    check_outputs(
        {"--out": out, "--out-sidecar": out_sidecar}, [item.path for item in inputs], force
    )
    record = write_mix(inputs, out, out_sidecar, seed, oversample)
    for item in record["inputs"]:
        click.echo(f"{item['path']}: {item['chosen']:,} of {item['samples_in_file']:,} samples")
    click.echo(f"wrote {out} ({record['samples']:,} samples)")
    click.echo(f"wrote {out_sidecar}")
