"""Result subcommands: evaluate a checkpoint, record the run's manifest, build the report."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from mini_trainer.cli.group import cli
from mini_trainer.cli.options import (
    FILE,
    force_option,
    max_tokens_option,
    model_options,
    out_option,
    resolve_model_option,
)
from mini_trainer.distributed.env import env_world
from mini_trainer.errors import UserError
from mini_trainer.log_setup import setup_logging
from mini_trainer.manifest import (
    build_manifest,
    check_manifest_out,
    parse_eval,
    parse_method_info,
    parse_run,
    write_manifest,
)
from mini_trainer.report.build import build_report


@cli.command("evaluate")
@model_options("Model to evaluate (a training run's final/ or hf_format/samples_N/, or a base).")
@click.option(
    "--data",
    "datas",
    required=True,
    multiple=True,
    type=click.Path(path_type=Path),
    help="Pre-tokenized eval JSONL (the training format), checked as `validate` checks it. "
    "Repeat it with --out (in pairs, in order) to evaluate several files with one model load.",
)
@click.option(
    "--out",
    "outs",
    required=True,
    multiple=True,
    type=FILE,
    help="Metrics JSON to write (one per --data).",
)
@max_tokens_option(
    "Tokens per packed micro-batch per process; a longer sample is an error.", default=8192
)
@click.option(
    "--lm-eval-tasks",
    default=None,
    metavar="A,B",
    help="Also run these lm-evaluation-harness tasks (needs the `eval` extra; offline).",
)
@click.option(
    "--lm-eval-include",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder of your own lm-eval task YAMLs (e.g. over local JSONL files).",
)
@click.option(
    "--lm-eval-batch-size", type=click.IntRange(min=1), default=8, show_default=True,
    help="Batch size of the harness's own model wrapper.",
)  # fmt: skip
@click.option(
    "--lm-eval-limit", type=click.IntRange(min=1), default=None,
    help="Evaluate only the first N documents of each harness task (for quick checks).",
)  # fmt: skip
@force_option("Replace an existing --out file.")
def evaluate(
    model: str,
    model_revision: str,
    datas: tuple[Path, ...],
    outs: tuple[Path, ...],
    max_tokens_per_gpu: int,
    lm_eval_tasks: str | None,
    lm_eval_include: Path | None,
    lm_eval_batch_size: int,
    lm_eval_limit: int | None,
    force: bool,
) -> None:
    """Loss, perplexity, answer-token accuracy and exact match of MODEL on DATA.

    DATA is pre-tokenized JSONL; the model predicts labels[t+1] from the tokens up to t, and
    only labels other than -100 count. Accuracy is teacher-forced (the arg-max token at each
    answer position, given the true prefix); exact match is the share of samples whose every
    answer token is right. Samples are packed without padding and the logits are computed a
    chunk at a time, as in training. Runs as one process, or under torchrun with the model
    sharded as in training:
    torchrun --nproc-per-node N -m mini_trainer evaluate --model M --data D --out F.json
    """
    # deferred: torch, transformers
    from mini_trainer.evaluate.command import run_evaluate, summary_line

    rank, local_rank, _ = env_world()
    setup_logging(rank)
    try:
        if len(datas) != len(outs):
            raise UserError(
                f"--data and --out come in pairs: {len(datas)} --data, {len(outs)} --out"
            )
        model = resolve_model_option(model, model_revision)
        results = run_evaluate(
            model, list(zip(datas, outs, strict=True)), max_tokens_per_gpu, lm_eval_tasks,
            lm_eval_include, lm_eval_batch_size, lm_eval_limit, force,
        )  # fmt: skip
    except UserError as error:
        if local_rank != 0:  # every rank finds it; print it once
            sys.exit(error.exit_code)
        raise
    if rank == 0:
        for result, out in zip(results, outs, strict=True):
            click.echo(summary_line(result))
            click.echo(f"wrote {out}")
        for task, metrics in results[0].get("lm_eval", {}).items():
            shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
            click.echo(f"lm-eval {task}: {shown}")


@cli.command("manifest")
@out_option("MANIFEST.json to write (the input of `mini-trainer report --manifest`).")
@click.option(
    "--task",
    "tasks",
    multiple=True,
    required=True,
    help="A stage's task, in stage order (repeat); also the evaluated tasks.",
)
@click.option(
    "--eval",
    "evals",
    multiple=True,
    type=(str, str, str, str, str),
    metavar="PATH METHOD LR STAGE TASK",
    help="An evaluation JSON and its cell; METHOD - LR - STAGE 0 for the base model (repeat).",
)
# Kept alike on purpose: click option blocks share one shape; each is its own flag.
@click.option(
    "--run",
    "runs",
    multiple=True,
    type=(str, str, str, str),
    metavar="PATH METHOD LR STAGE",
    help="A training output folder (metrics.jsonl, training_args.json) (repeat).",
)
@click.option(
    "--data-summary",
    "data_summaries",
    multiple=True,
    type=(str, str),
    metavar="PATH TASK",
    help="A `validate` summary JSON of a task's training file (repeat).",
)
@click.option(
    "--benchmark",
    "benchmarks",
    multiple=True,
    type=(str, str, str, str),
    metavar="PATH METHOD LR STAGE",
    help="A Snakemake benchmark TSV of a job done for that cell (its wall time) (repeat).",
)
@click.option(
    "--score",
    "scores",
    multiple=True,
    type=(str, str, str, str, str),
    metavar="PATH METHOD LR STAGE TASK",
    help="A `trace-score` JSON and its cell, as --eval (repeat).",
)
@click.option(
    "--method-info",
    "method_infos",
    multiple=True,
    type=(str, str),
    metavar="NAME JSON",
    help='A method\'s description: {"label", "method", "settings", "bound"} (repeat).',
)
@force_option("Replace an existing manifest.")
def manifest(
    out: Path,
    tasks: tuple[str, ...],
    evals: tuple[tuple[str, str, str, str, str], ...],
    runs: tuple[tuple[str, str, str, str], ...],
    data_summaries: tuple[tuple[str, str], ...],
    benchmarks: tuple[tuple[str, str, str, str], ...],
    method_infos: tuple[tuple[str, str], ...],
    scores: tuple[tuple[str, str, str, str, str], ...],
    force: bool,
) -> None:
    """Write the report manifest: which file is which cell of the experiment.

    The pipeline's `manifest` rule calls this with every file it produced; by hand, list the
    evaluation JSONs, run folders and data summaries of an experiment. Paths are written as
    given and not checked: `report` shows a missing file as a missing cell.
    """
    check_manifest_out(out, force)
    content = build_manifest(
        list(tasks),
        [parse_eval(fields) for fields in evals],
        [parse_run(fields) for fields in runs],
        list(data_summaries),
        [parse_run(fields, "--benchmark") for fields in benchmarks],
        dict(parse_method_info(fields) for fields in method_infos),
        [parse_eval(fields, "--score") for fields in scores],
    )
    write_manifest(out, content, force)
    click.echo(f"wrote {out} ({len(content['entries'])} entries, {len(tasks)} tasks)")


@cli.command("report")
@click.argument("inputs", nargs=-1, type=click.Path(path_type=Path), metavar="[INPUT]...")
@out_option("Folder to write report.html and its PNG plots into.", folder=True)
@click.option(
    "--manifest",
    type=FILE,
    default=None,
    help="JSON naming each run / eval / data summary with its method, lr, stage and task.",
)
@force_option("Replace an existing OUT/report.html.")
def report(inputs: tuple[Path, ...], out: Path, manifest: Path | None, force: bool) -> None:
    """An HTML report with plots: training curves, accuracy matrices, AA/BWT, frontiers.

    With --manifest (see docs/evaluate.md): per method and learning rate the accuracy matrix
    (stage trained x task evaluated, base model as row 0), average accuracy and backward
    transfer, and the retention-vs-learning frontier over learning rates; plus loss, learning
    rate and throughput of every run, the data summaries and provenance. INPUTs are extra
    training output folders or evaluate JSONs. A missing or failed evaluation is shown as
    missing, never filled in.
    """
    page = build_report(out, manifest, list(inputs), force)
    click.echo(f"wrote {page}")
