"""Training subcommands: the job itself, the pipeline's launcher, and the memory plan."""

from __future__ import annotations

import json
import os
import shlex
import sys

import click

from mini_trainer.cli.group import cli
from mini_trainer.cli.options import POSITIVE_FINITE
from mini_trainer.distributed.lifetime import STOP_WITH_ENV
from mini_trainer.distributed.slurm import plan_launch, with_allocation
from mini_trainer.errors import UserError
from mini_trainer.launch_args import split_launcher_args
from mini_trainer.plan.experiment import render as render_experiment
from mini_trainer.plan.inputs import Cluster, make_plan
from mini_trainer.plan.render import table
from mini_trainer.train import launch as launch_training
from mini_trainer.train import main as train_main
from mini_trainer.train import pin_commit_flags
from mini_trainer.training_args import parse_training_args

DROP_STATES_ENV = "MINI_TRAINER_DROP_STATES"
"""1: `launch` adds --drop-states-after-final. The pipeline's train rule sets it from its
`drop_states` resource, not its flags: a change of `keep_states_after_final` then reruns no
finished job (Snakemake reruns a job whose parameters changed)."""
DROP_STATES_FLAG = "--drop-states-after-final"


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
    if os.environ.get(DROP_STATES_ENV) == "1" and DROP_STATES_FLAG not in flags:
        flags.append(DROP_STATES_FLAG)  # the pipeline's keep_states_after_final: false
    parse_training_args(flags)  # a bad flag fails here, before any process or node starts
    env = with_allocation(os.environ)
    if env.get("SLURM_JOB_ID") and "SLURM_STEP_ID" not in env:  # srun starts one per node:
        flags = pin_commit_flags(flags)  # a Hub branch's commit decided once, for every node
    plan = plan_launch(env, nproc_per_node, flags, rdzv_port=rdzv_port)
    if dry_run:
        click.echo(shlex.join(plan.argv))
        return
    click.echo(f"mini-trainer launch ({plan.mode}): {shlex.join(plan.argv)}", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    if plan.torchrun is None:
        # exec, not a child: Slurm's and the user's signals go straight to srun. The pid to
        # stop with names a process of this host only; Slurm ends the steps with the job.
        os.environ.pop(STOP_WITH_ENV, None)
        os.execvp(plan.argv[0], plan.argv)
    # torchrun's elastic agent in this process: the launch path of `train --nproc-per-node`
    # (signals forwarded to the workers, each error printed once, the documented exit status).
    sys.exit(launch_training(plan.torchrun, flags))


@cli.command(
    "plan",
    context_settings={"ignore_unknown_options": True},
)
@click.option(
    "--config", "config_file", default=None, metavar="FILE",
    help="A pipeline config (config/config.yaml): print the whole experiment's peak disk "
    "instead (every run and its exports, SVD cache, evaluation, data file and log; the flags "
    "below come from the config).",
)  # fmt: skip
@click.option(
    "--model", default=None, metavar="FOLDER|ORG/NAME",
    help="Model folder, or Hugging Face Hub id ORG/NAME (no weights are fetched); only its "
    "config.json is read (required without --config).",
)  # fmt: skip
@click.option(
    "--model-revision", default=None, metavar="REV",
    help="Hub id only: branch, tag or commit [default: main].",
)  # fmt: skip
# Kept alike on purpose: click option blocks share one shape; each is its own flag.
@click.option(
    "--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes in the job."
)
@click.option(
    "--gpus-per-node", type=click.IntRange(min=1), default=None,
    help="GPUs per node (processes per node with --device cpu); required without --config.",
)  # fmt: skip
@click.option(
    "--gpu-memory-gib",
    type=POSITIVE_FINITE,
    default=None,
    help="Memory of one GPU (or, with --device cpu, the host memory per rank); required "
    "without --config.",
)
@click.option(
    "--gpu",
    "gpu_name",
    default=None,
    help="GPU name for its peak bf16 TFLOP/s (H100, H200, A100, B200, L40S, ...).",
)
@click.option(
    "--peak-tflops",
    type=POSITIVE_FINITE,
    default=None,
    help="Peak TFLOP/s of one GPU for the step-time estimate (instead of --gpu).",
)
@click.option(
    "--bandwidth-gbs",
    type=POSITIVE_FINITE,
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
def plan(config_file: str | None, model: str | None, model_revision: str | None, nodes: int,
         gpus_per_node: int | None, gpu_memory_gib: float | None, gpu_name: str | None,
         peak_tflops: float | None, bandwidth_gbs: float | None, device: str, as_json: bool,
         require_fit: bool, train_flags: tuple[str, ...]) -> None:  # fmt: skip
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
    With --config FILE (a pipeline config), the peak disk of the whole experiment instead.
    See docs/plan.md.
    """
    # deferred: torch
    from mini_trainer.training.flops import peak_flops

    if config_file is not None:
        given = [flag for flag, value in (("--model", model), ("--gpus-per-node", gpus_per_node),
                 ("--gpu-memory-gib", gpu_memory_gib)) if value is not None]  # fmt: skip
        if given or train_flags:
            extra = " ".join(given + list(train_flags))
            raise UserError(
                f"--config: takes the model, GPUs and training flags from the config; got {extra}"
            )
        lines = experiment_lines_of(config_file)
        click.echo(json.dumps(lines, indent=2) if as_json else render_experiment(
            lines, f"{config_file}: disk of the whole experiment"))  # fmt: skip
        return
    for flag, value in (("--model", model), ("--gpus-per-node", gpus_per_node),
                        ("--gpu-memory-gib", gpu_memory_gib)):  # fmt: skip
        if value is None:
            raise UserError(f"{flag}: required (or --config FILE for a whole experiment)")

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


def experiment_lines_of(path: str) -> list[dict]:
    """The disk lines of the experiment a pipeline config describes (`plan/experiment.py`):
    the config checked as the Snakefile checks it, each method planned once on its options."""
    # deferred: the pipeline's modules import snakemake
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    from mini_trainer.pipeline import (
        checks,
        commands,
        data_sizes,
        experiment,
        layout,
        planning,
        schema,
    )
    from mini_trainer.plan.experiment import DataDisk, MethodDisk, experiment_lines

    try:
        config = checks.read_config_file(path)
        validate(config, str(schema.REPO_ROOT / schema.SCHEMA_FILE))  # fills in the defaults
        checks.check_config(config)
    except WorkflowError as error:
        raise UserError(f"{path}: {str(error).splitlines()[0]}") from None
    launch = config["launch"]
    gpus = launch["gpus_per_node"]
    cluster = Cluster(launch["nodes"], gpus or launch["nproc_per_node"],
                      launch.get("gpu_memory_gib", 1.0), "cuda" if gpus else "cpu")  # fmt: skip
    found = experiment.experiment(config, lambda path: data_sizes.size_of(config, path))
    sizes = {path: data_sizes.size_of(config, path) for path in found.data_files}
    data = DataDisk(
        data_bytes=sum(size.bytes for size in sizes.values() if size is not None),
        data_files=len(sizes),
        unknown=tuple(path for path, size in sizes.items() if size is None),
        jobs=found.jobs,
    )
    methods = []
    for name, runs in found.methods.items():
        if not runs.runs:
            continue
        flags = commands.cli_flags(planning.plan_training_options(config, name))
        result = make_plan(layout.base_model(config), config.get("model_revision"), cluster,
                           shlex.split(flags))  # fmt: skip
        disk = {line["name"]: line["bytes"] for line in result["per_node"]["disk"]}
        lr = layout.lr_str(config["methods"][name]["learning_rates"][0])
        keep = checks.method_training_args(config, name, lr).keep_states
        methods.append(MethodDisk(
            name, runs.runs, runs.chains, runs.svd_caches, keep,
            disk["a training state (state/step_K)"], disk["a Hugging Face checkpoint"],
            disk.get("the SVD cache", 0), runs.steps, runs.exports,
        ))  # fmt: skip
    return experiment_lines(methods, found.keep_states_after_final, found.best,
                            found.evaluations, data)  # fmt: skip
