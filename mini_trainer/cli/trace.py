"""TRACE subcommands: its task files as chat JSONL, a checkpoint's generated answers, and TRACE's
per-task scores of them."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mini_trainer.cli.group import cli
from mini_trainer.cli.options import (
    EXISTING_FILE,
    force_option,
    model_options,
    out_option,
    resolve_model_option,
)
from mini_trainer.data.outputs import check_outputs
from mini_trainer.data.trace import TASKS, read_samples, write_chat
from mini_trainer.errors import UserError
from mini_trainer.evaluate.generate import (
    generate_answers,
    read_predictions,
    read_prompts,
    write_predictions,
)
from mini_trainer.evaluate.trace_metrics import task_score
from mini_trainer.io_utils import atomic_write_text, file_sha256

TASK_CHOICE = click.Choice(TASKS)


@cli.command("trace-chat")
@click.argument("source", type=EXISTING_FILE)
@out_option("Chat JSONL to write (line N is sample N of SOURCE).")
@click.option("--sha256", metavar="HEX", help="SOURCE's expected SHA-256 (refused otherwise).")
@force_option("Replace an existing output file.")
def trace_chat(source: Path, out: Path, sha256: str | None, force: bool) -> None:
    """Turn one TRACE file (a JSON array of {"prompt", "answer"}) into chat JSONL.

    The prompt (which holds TRACE's task instruction) becomes the user turn and the answer the
    assistant turn, both verbatim (docs/data.md). Every problem is printed as
    FILE:INDEX: FIELD: reason; on any problem the exit status is 2 and OUT is not written.
    """
    check_outputs({"--out": out}, [source], force)
    if sha256 is not None and file_sha256(source) != sha256.lower():
        raise UserError(f"{source}: SHA-256 {file_sha256(source)}, expected {sha256} (--sha256)")
    count = write_chat(source, out)
    click.echo(f"wrote {out} ({count:,} samples)")
    if sha256 is None:  # say what to pin, so that a rerun reads the same bytes
        click.echo(f"{source}: not pinned: SHA-256 {file_sha256(source)} (pin it with --sha256, "
                   "or the pipeline config's trace.sha256)", err=True)  # fmt: skip


@cli.command("generate")
@model_options("Model (a checkpoint's folder) that answers.")
@click.option(
    "--data",
    "data",
    required=True,
    type=EXISTING_FILE,
    help="Chat JSONL: each line's messages but its last assistant turn are the prompt.",
)
@out_option('Predictions JSONL to write: line N {"prediction": ...} answers line N of --data.')
@click.option(
    "--max-new-tokens",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="Longest answer in tokens (TRACE: 512).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Prompts per generate call (left-padded).",
)
@force_option("Replace an existing output file.")  # fmt: skip
def generate(
    model: str, model_revision: str, data: Path, out: Path, max_new_tokens: int,
    batch_size: int, force: bool,
) -> None:  # fmt: skip
    """Greedy answers of a checkpoint to chat prompts, one process (a GPU when there is one).

    The input for `trace-score`: e.g. `--data results/data/trace/FOMC.eval.jsonl`. Every bad
    line is printed as FILE:LINE: FIELD: reason (exit status 2, nothing written).
    """
    check_outputs({"--out": out}, [data], force)
    prompts = read_prompts(data)
    folder = resolve_model_option(model, model_revision)
    answers = generate_answers(folder, prompts, max_new_tokens, batch_size)
    write_predictions(out, answers)
    click.echo(f"wrote {out} ({len(answers):,} answers)")


@cli.command("trace-score")
@click.option("--task", required=True, type=TASK_CHOICE, help="The TRACE task (its metric).")
@click.option(
    "--data", "data", required=True, type=EXISTING_FILE,
    help="The task's TRACE file that was answered (its test.json): prompts and answers.",
)  # fmt: skip
@click.option(
    "--predictions", required=True, type=EXISTING_FILE,
    help='JSONL, line N {"prediction": "..."}: the generated answer to sample N of --data.',
)  # fmt: skip
@out_option("Score JSON to write: {task, metric, score, num_samples}.")
@force_option("Replace an existing output file.")
def trace_score(task: str, data: Path, predictions: Path, out: Path, force: bool) -> None:
    """Score generated answers with TRACE's metric of the task (docs/evaluate.md).

    Accuracy (C-STANCE, FOMC, NumGLUE-cm/ds; ScienceQA's option letter), ROUGE-L (MeetingBank),
    edit similarity (Py150) or SARI (20Minuten), all on [0, 1], computed as TRACE computes them.
    """
    check_outputs({"--out": out}, [data, predictions], force)
    samples = read_samples(data)
    generated = read_predictions(predictions)
    if len(generated) != len(samples):
        raise UserError(
            f"{predictions}: {len(generated):,} predictions for {len(samples):,} samples "
            f"of {data} (one line per sample, in order)"
        )
    result = task_score(
        task,
        [s["prompt"] for s in samples],
        generated,
        [s["answer"] for s in samples],
    )
    atomic_write_text(out, json.dumps({"task": task, **result}, indent=2) + "\n")
    click.echo(f"{task}: {result['metric']} {result['score']:.4f} over "
               f"{result['num_samples']:,} samples; wrote {out}")  # fmt: skip
