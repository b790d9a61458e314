"""The training job's entry point: `torchrun --nproc-per-node N -m mini_trainer.train --help`.

Arguments are parsed and checked here, the process group is started, and the run itself is
`training/loop.py`'s `train`, which reads top to bottom in named phases. `launch` is the one
launch path (`mini-trainer train --nproc-per-node`, `mini-trainer launch`, `run_training`): the
flags checked here once per node, then the workers started by `distributed/launcher.py`.

torch is imported only once the flags are good (the imports marked `# deferred:`), so a bad
flag is one line at once, before any worker starts.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import traceback
from dataclasses import replace
from pathlib import Path

from mini_trainer.data.outputs import check_writable
from mini_trainer.distributed.env import env_world
from mini_trainer.distributed.launcher import (
    REPRODUCIBLE_MKL,
    import_torch_quietly,
    supervise,
    write_report,
)
from mini_trainer.distributed.lifetime import lost_peer, stop_with_parent
from mini_trainer.distributed.retry import record_exit, refuse_final_retry, requeue_if_asked
from mini_trainer.errors import UserError
from mini_trainer.launch_args import TorchrunArgs
from mini_trainer.log_setup import setup_logging
from mini_trainer.models.hub import (
    decide_commit,
    hub_source,
    not_a_model,
    resolve_model,
    resolve_once_per_node,
)
from mini_trainer.training_args import TrainingArgs, parse_training_args

log = logging.getLogger("mini_trainer")


def check_inputs(args: TrainingArgs, world_size: int) -> None:
    """Problems that need no process group, reported before anything starts."""
    problems = []
    for name in ("data_path", "data_index", "validation_data_path"):
        value = getattr(args, name)
        if value is not None and not Path(value).is_file():
            problems.append(f"{value}: --{name.replace('_', '-')}: no such file")
    if problem := not_a_model(args.model_name_or_path, "--model-name-or-path"):
        problems.append(problem)
    elif Path(args.model_name_or_path).is_dir():
        # deferred: torch, only once the flags are good
        from mini_trainer.models.safetensors_file import check_weight_files

        try:
            check_weight_files(args.model_name_or_path)  # headers only: before any worker starts
        except UserError as error:
            problems += error.lines
    groups = world_size // args.context_parallel  # each group packs one row per micro-batch
    if world_size % args.context_parallel:
        problems.append(
            f"--context-parallel: {args.context_parallel} does not divide the number of ranks "
            f"({world_size})"
        )
    elif args.batch_size < groups:
        what = "context-parallel groups" if args.context_parallel > 1 else "ranks"
        problems.append(
            f"--batch-size: {args.batch_size} is smaller than the number of {what} ({groups})"
        )
    if args.wandb_project and importlib.util.find_spec("wandb") is None:
        problems.append(
            "--wandb-project: wandb is not installed (pip install 'mini-trainer[wandb]')"
        )
    try:
        check_writable(Path(args.output_dir), "--output-dir")
    except UserError as error:
        problems += error.lines
    if problems:
        raise UserError(*problems)
    check_output_dir(Path(args.output_dir), args.resume)


def check_output_dir(out: Path, resume: bool | str) -> None:
    """Refuse at once a folder that the job's rank 0 would refuse: one in use by a running job
    (its lock's message), or one run_folder.py's rule refuses (without reading state contents)."""
    # deferred: torch, only once the flags are good
    from mini_trainer.distributed.run_lock import in_use
    from mini_trainer.training.run_folder import classify, start_decision

    if problem := in_use(out):
        raise UserError(problem)
    start_decision(classify(out, verify_contents=False), resume)


def model_commit(args: TrainingArgs) -> str | None:
    """The Hub commit this job trains from, decided without fetching a file; None for a local
    folder. On `--resume`, a revision that names another commit than the run recorded is
    refused here, before anything of that commit is downloaded."""
    name = args.model_name_or_path
    if Path(name).is_dir() or not_a_model(name, "--model-name-or-path") is not None:
        return None
    return decide_commit(name, args.model_revision, Path(args.output_dir) if args.resume else None)


def resolve_model_args(args: TrainingArgs) -> TrainingArgs:
    """A Hub id resolved (once per node) to its cache snapshot folder, the revision pinned to
    its commit: the run, its records and its fingerprint then name the exact weights."""
    commit = model_commit(args)
    resolved = resolve_once_per_node(
        args.model_name_or_path, commit or args.model_revision, flag="--model-name-or-path"
    )
    if resolved.commit is None:
        return args
    return replace(args, model_name_or_path=str(resolved.folder), model_revision=resolved.commit)


def main(argv: list[str] | None = None) -> int:
    """Run one worker of the job; return its exit status (see distributed/launcher.py)."""
    rank, local_rank, world_size = env_world()
    if "TORCHELASTIC_RUN_ID" in os.environ:  # launched by torchrun's agent: stop if it dies
        stop_with_parent()
    setup_logging(rank)
    started = False
    try:
        args = parse_training_args(argv)
        check_inputs(args, world_size)
        args = resolve_model_args(args)
        if rank == 0:
            for warning in args.warnings():
                log.warning("warning: %s", warning)
        started = True
        status = run(args)
    except UserError as error:
        # Under `mini-trainer train --nproc-per-node` the launcher prints each line once.
        if not write_report(rank, error.exit_code, error.lines):
            _print_error(error, rank, local_rank, started)
        return error.exit_code
    except KeyboardInterrupt:  # Ctrl-C before the training loop listens for it
        print(f"[rank{rank}] interrupted before training started", file=sys.stderr)
        return 130
    except (Exception, _checkpoint_exception()) as error:
        if line := lost_peer(error):  # another rank died: its loss is the news, not our stack
            if not write_report(rank, 1, [line], lost_peer=True):
                print(f"[rank{rank}] error: {line}", file=sys.stderr)
            return 1
        if not write_report(rank, 1, traceback=traceback.format_exc()):
            raise
        return 1
    if status:
        write_report(rank, status)
    return status


def _checkpoint_exception() -> type[BaseException]:
    """DCP's `CheckpointException` (a BaseException, so `except Exception` misses it)."""
    # deferred: torch, only once the flags are good
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException


def _print_error(error: UserError, rank: int, local_rank: int, started: bool) -> None:
    """Print a UserError under plain torchrun or alone.

    Errors found before the process group starts are the same on every rank (same flags, same
    files): local rank 0 prints them, once per node. Later errors may be one rank's own (a
    sample only it reads), so every rank prints its own, rank 0's without a prefix.
    """
    if started or local_rank == 0:
        prefix = "" if rank == 0 else f"[rank{rank}] "
        for line in error.lines:
            print(f"{prefix}error: {line}", file=sys.stderr)


def run(args: TrainingArgs) -> int:
    # deferred: torch, only once the flags are good
    from mini_trainer.distributed.run_lock import release
    from mini_trainer.distributed.runtime import deterministic_kernels, init_runtime, shutdown
    from mini_trainer.training.loop import train

    runtime = init_runtime()
    try:
        with deterministic_kernels(args.deterministic, runtime):
            return train(agree_on_model(args, runtime), runtime)
    finally:
        release()
        shutdown()


def agree_on_model(args: TrainingArgs, runtime) -> TrainingArgs:
    """Every rank trains from rank 0's Hub commit.

    Each node's launcher resolves a branch when it starts; nodes started by hand (not through
    `mini-trainer launch` under Slurm, which decides once) could meet a branch that moved
    between their starts. A rank whose commit differs from rank 0's takes rank 0's (resolved
    once per node, fetched if needed) and says so."""
    # deferred: torch (distributed/runtime.py), only once the flags are good
    from mini_trainer.distributed.runtime import broadcast_object

    mine = hub_source(args.model_name_or_path)
    if runtime.world_size <= 1:
        return args
    chosen = broadcast_object(mine, runtime)
    if mine is None or chosen is None or mine == chosen:
        return args
    log.warning(
        "warning: this node resolved %s to commit %s, rank 0 to %s (the branch moved between "
        "the nodes' starts): training from rank 0's commit",
        mine["hub_id"], mine["commit"], chosen["commit"],
    )  # fmt: skip
    resolved = resolve_once_per_node(
        chosen["hub_id"], chosen["commit"], flag="--model-name-or-path"
    )
    return replace(args, model_name_or_path=str(resolved.folder), model_revision=resolved.commit)


def pin_model_revision(args: TrainingArgs, train_argv: list[str]) -> list[str]:
    """Resolve a Hub id here, once per node before any worker starts (its errors print once),
    and hand the workers the commit, so every rank reads the same snapshot from the cache.
    (Across nodes: `mini-trainer launch` decides the commit before srun starts the nodes, and
    the workers take rank 0's commit: `agree_on_model`.)"""
    commit = model_commit(args)
    if commit is None:
        resolve_model(args.model_name_or_path, args.model_revision, flag="--model-name-or-path")
        return train_argv
    resolve_model(args.model_name_or_path, commit, flag="--model-name-or-path")  # fetch it
    return [*train_argv, "--model-revision", commit]


def pin_commit_flags(train_argv: list[str]) -> list[str]:
    """The flags with a Hub id's revision replaced by the commit it names now (no file is
    fetched): for `mini-trainer launch` before srun starts one launcher per node, so every node
    trains from the same commit even if the branch moves between their starts."""
    commit = model_commit(parse_training_args(train_argv))
    return train_argv if commit is None else [*train_argv, "--model-revision", commit]


def launch(torchrun_args: TorchrunArgs, train_argv: list[str]) -> int:
    """Start the training job on this node and supervise it; return its exit status.

    The one launch path: `mini-trainer train --nproc-per-node`, `mini-trainer launch` (in each
    Slurm task) and `run_training` (through `mini-trainer train`) all run it. The flags are
    checked here, before any worker starts, so a bad flag is one line at once."""
    args = parse_training_args(train_argv)
    refuse_final_retry(Path(args.output_dir))  # a pipeline's retry of a job ended 2 or 3
    import_torch_quietly()  # flags good: torch now, before anything below imports it
    check_inputs(args, torchrun_args.nproc_per_node * torchrun_args.nnodes)
    status, lines = supervise(torchrun_args, pin_model_revision(args, train_argv))
    record_exit(Path(args.output_dir), status, lines)
    requeue_if_asked(status)  # a pipeline's Slurm job after 75 (or 1): Slurm runs it again
    return status


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault(*REPRODUCIBLE_MKL)  # before torch's first MKL call (plain torchrun)
    sys.exit(main())
