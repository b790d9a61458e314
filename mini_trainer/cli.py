"""The `mini-trainer` command: one subcommand per pipeline step.

Heavy imports (torch, transformers) happen inside the subcommands that need them (each marked
`# deferred:`), so `--help` and the light commands stay fast.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import click

from mini_trainer import __version__
from mini_trainer.cli_options import (
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
from mini_trainer.data.outputs import check_outputs, check_writable
from mini_trainer.data.split import split_validation as split
from mini_trainer.data.tokenize import load_chat_tokenizer, tokenize_jsonl, tokenizer_warnings
from mini_trainer.data.validate import build_index, read_vocab_size, summary_text, write_index
from mini_trainer.distributed.slurm import plan_launch, with_allocation
from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_write_text
from mini_trainer.log_setup import setup_logging
from mini_trainer.manifest import (
    build_manifest,
    check_manifest_out,
    parse_eval,
    parse_run,
    write_manifest,
)
from mini_trainer.models.hub import hub_source
from mini_trainer.models.hub import resolve_model as resolve
from mini_trainer.plan.inputs import Cluster, make_plan
from mini_trainer.plan.render import table
from mini_trainer.report.build import build_report
from mini_trainer.train import launch as launch_training
from mini_trainer.train import main as train_main
from mini_trainer.training_args import parse_training_args, split_launcher_args


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


@cli.command(
    "train",
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
def train(train_args: tuple[str, ...]) -> None:
    """Run the training job (same flags as `python -m mini_trainer.train`; see --help).

    With --nproc-per-node N (and --nnodes, --node-rank, --rdzv-endpoint, --rdzv-id,
    --rdzv-conf, --local-addr for several nodes, as torchrun's) it launches the N workers
    itself, forwards SIGTERM/SIGINT/SIGUSR1 to them, prints each error once and exits
    with the documented status; without it, it is one worker, to run
    under torchrun: torchrun --nproc-per-node N $(which mini-trainer) train ...
    """
    torchrun_args, worker_args = split_launcher_args(list(train_args))
    if torchrun_args is None:
        sys.exit(train_main(worker_args))
    sys.exit(launch_training(torchrun_args, worker_args))


@cli.command("evaluate")
@model_options("Model to evaluate (a training run's final/ or hf_format/samples_N/, or a base).")
@click.option(
    "--data",
    required=True,
    type=click.Path(path_type=Path),
    help="Pre-tokenized eval JSONL (the training format), checked as `validate` checks it.",
)
@out_option("Metrics JSON to write.")
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
    data: Path,
    out: Path,
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

    rank = int(os.environ.get("RANK", "0"))
    setup_logging(rank)
    try:
        model = resolve_model_option(model, model_revision)
        result = run_evaluate(
            model, data, out, max_tokens_per_gpu, lm_eval_tasks, lm_eval_include,
            lm_eval_batch_size, lm_eval_limit, force,
        )  # fmt: skip
    except UserError as error:
        if int(os.environ.get("LOCAL_RANK", "0")) != 0:  # every rank finds it; print it once
            sys.exit(error.exit_code)
        raise
    if rank == 0:
        click.echo(summary_line(result))
        for task, metrics in result.get("lm_eval", {}).items():
            shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
            click.echo(f"lm-eval {task}: {shown}")
        click.echo(f"wrote {out}")


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
@force_option("Replace an existing manifest.")
def manifest(
    out: Path,
    tasks: tuple[str, ...],
    evals: tuple[tuple[str, str, str, str, str], ...],
    runs: tuple[tuple[str, str, str, str], ...],
    data_summaries: tuple[tuple[str, str], ...],
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
    )
    write_manifest(out, content, force)
    click.echo(f"wrote {out} ({len(content['entries'])} entries, {len(tasks)} tasks)")


@cli.command(
    "launch",
    context_settings={"ignore_unknown_options": True},
)
@click.option(
    "--nproc-per-node",
    required=True,
    type=click.IntRange(min=1),
    help="Training processes per node (one per GPU, or per CPU slot).",
)
@click.option(
    "--rdzv-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Rendezvous port on the first host of a multi-node job "
    "[default: derived from the Slurm job and step ids].",
)
@click.option("--dry-run", is_flag=True, help="Print the command instead of running it.")
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
def launch(
    nproc_per_node: int, rdzv_port: int | None, dry_run: bool, train_args: tuple[str, ...]
) -> None:
    """Start the training job with torchrun, on this machine or across a Slurm allocation.

    TRAIN_ARGS are the training job's flags (see `mini-trainer train --help`), after `--`.
    Outside Slurm: torchrun --standalone. In a Slurm batch job: srun starts one task per node
    (the job's --ntasks), and each task runs torchrun with --nnodes, --node-rank and a c10d
    rendezvous on the first host of the allocation. The same command works on 1 or N nodes.
    torchrun runs as `train --nproc-per-node` runs it: signals forwarded to the workers, each
    error printed once, exit status 0, 2, 3, 75 or 1 (docs/training.md). See docs/slurm.md.
    """
    flags = list(train_args)
    parse_training_args(flags)  # a bad flag fails here, before any process or node starts
    plan = plan_launch(with_allocation(os.environ), nproc_per_node, flags, rdzv_port=rdzv_port)
    if dry_run:
        click.echo(shlex.join(plan.argv))
        return
    click.echo(f"mini-trainer launch ({plan.mode}): {shlex.join(plan.argv)}", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    if plan.torchrun is None:
        # exec, not a child: Slurm's and the user's signals go straight to srun.
        os.execvp(plan.argv[0], plan.argv)
    # torchrun's elastic agent in this process: the launch path of `train --nproc-per-node`
    # (signals forwarded to the workers, each error printed once, the documented exit status).
    sys.exit(launch_training(plan.torchrun, flags))


@cli.command(
    "plan",
    context_settings={"ignore_unknown_options": True},
)
@click.option("--model", required=True, help="Model folder; only its config.json is read.")
@click.option("--model-revision", default=None, help="Revision of a Hub id (see issue 20).")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--gpus-per-node", type=click.IntRange(min=1), required=True)
@click.option(
    "--gpu-memory-gib",
    type=click.FloatRange(min=0, min_open=True),
    required=True,
    help="Memory of one GPU (or, with --device cpu, the host memory per rank).",
)
@click.option(
    "--gpu",
    "gpu_name",
    default=None,
    help="GPU name for its peak bf16 TFLOP/s (H100, H200, A100, B200, L40S, ...).",
)
@click.option(
    "--peak-tflops",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Peak TFLOP/s of one GPU for the step-time estimate (instead of --gpu).",
)
@click.option(
    "--bandwidth-gbs",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Collective bandwidth per GPU, GB/s [default: 360 on one node, 45 across].",
)
@click.option(
    "--device",
    type=click.Choice(["cuda", "cpu"]),
    default="cuda",
    show_default=True,
    help="cpu: plan a CPU run (fp32, no allocator overhead), as the tests train.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
@click.option(
    "--require-fit",
    is_flag=True,
    help="Exit with status 4 (after printing the plan) when the peak does not fit.",
)
@click.argument("train_flags", nargs=-1, type=click.UNPROCESSED)
def plan(model: str, model_revision: str | None, nodes: int, gpus_per_node: int,
         gpu_memory_gib: float, gpu_name: str | None, peak_tflops: float | None,
         bandwidth_gbs: float | None, device: str, as_json: bool, require_fit: bool,
         train_flags: tuple[str, ...]) -> None:  # fmt: skip
    """Per-GPU memory of a training configuration, from MODEL's config.json alone.

    TRAIN_FLAGS are `train`'s own flags, same names and checks: --max-tokens-per-gpu T
    (tokens of one packed row), --batch-size, --osft --osft-unfreeze-rank-ratio U,
    --activation-checkpointing, --cpu-offload, --use-liger-kernels, --defer-grad-sync ...
    Prints per GPU: parameter, gradient and optimizer shards, OSFT factors, the FSDP2 units in
    flight, the activations of one row of T tokens (traced on meta tensors), the loss head's
    buffers, communication buffers and allocator overhead; the peak, whether it fits with its
    margin, and the largest T that fits. Per node: host memory and disk. Step time is an
    estimate at a stated peak and bandwidth. Exit status 2 on bad input; 0 whether or not it
    fits (the JSON's per_gpu.fits says), or 4 with --require-fit when it does not.
    See docs/plan.md.
    """
    # deferred: torch
    from mini_trainer.training.flops import peak_flops

    if gpu_name is not None and peak_flops(gpu_name) is None and peak_tflops is None:
        raise UserError(f"--gpu: unknown GPU name {gpu_name!r} (pass --peak-tflops instead)")
    cluster = Cluster(nodes, gpus_per_node, gpu_memory_gib, device, gpu_name, peak_tflops,
                      bandwidth_gbs)  # fmt: skip
    result = make_plan(model, model_revision, cluster, list(train_flags))
    click.echo(json.dumps(result, indent=2) if as_json else table(result))
    gpu = result["per_gpu"]
    if require_fit and not gpu["fits"]:
        click.echo(
            f"error: the peak {gpu['peak_bytes'] / 1024**3:.1f} GiB per GPU does not fit in "
            f"{gpu['budget_bytes'] / 1024**3:.1f} GiB (largest --max-tokens-per-gpu that fits: "
            f"{gpu['largest_max_tokens_per_gpu']})",
            err=True,
        )
        sys.exit(4)


def main() -> None:
    cli(prog_name="mini-trainer")
