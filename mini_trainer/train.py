"""The training job: `torchrun --nproc-per-node N -m mini_trainer.train --help`.

Read it top to bottom: arguments, process group, data, model, optimizer, resume, then the loop.
Each optimizer step takes `batch_size` samples; they are packed into micro-batches of at most
`max_tokens_per_gpu` tokens per rank; every micro-batch's summed token loss is divided by the
loss-token count of the whole global batch, so a step equals one big batch however it is split.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_write_text
from mini_trainer.training_args import TrainingArgs, parse_training_args

log = logging.getLogger("mini_trainer")


@dataclass
class Progress:
    """Counters that survive a resume (saved in the state's trainer_state.json)."""

    step: int = 0
    samples_seen: int = 0
    loss_tokens_seen: int = 0
    samples_at_last_checkpoint: int = 0


def check_inputs(args: TrainingArgs, world_size: int) -> None:
    """Problems that need no process group, reported before anything starts."""
    problems = []
    for name in ("data_path", "data_index"):
        value = getattr(args, name)
        if value is not None and not Path(value).is_file():
            problems.append(f"{value}: --{name.replace('_', '-')}: no such file")
    if not Path(args.model_name_or_path).is_dir():
        problems.append(f"{args.model_name_or_path}: --model-name-or-path: no such model folder")
    if args.batch_size < world_size:
        problems.append(
            f"--batch-size: {args.batch_size} is smaller than the number of ranks ({world_size})"
        )
    if args.osft:
        problems.append("--osft: OSFT is not available in this version of mini-trainer")
    if args.wandb_project and importlib.util.find_spec("wandb") is None:
        problems.append(
            "--wandb-project: wandb is not installed (pip install 'mini-trainer[wandb]')"
        )
    out = Path(args.output_dir)
    if not args.resume and any(
        (out / name).exists() for name in ("state", "final", "metrics.jsonl")
    ):
        problems.append(
            f"{out}: --output-dir already holds a training run "
            "(pass --resume to continue it, or choose another folder)"
        )
    if problems:
        raise UserError(*problems)


def main(argv: list[str] | None = None) -> int:
    from mini_trainer.training.distributed import env_world

    rank, local_rank, world_size = env_world()
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"[rank{rank}] %(asctime)s %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        args = parse_training_args(argv)
        check_inputs(args, world_size)
        return run(args)
    except UserError as error:
        # Every rank finds the same problems; print them once per node (another node's files
        # may differ), and only rank 0's without a prefix.
        if local_rank == 0:
            prefix = "" if rank == 0 else f"[rank{rank}] "
            for line in error.lines:
                print(f"{prefix}error: {line}", file=sys.stderr)
        return error.exit_code


def run(args: TrainingArgs) -> int:
    from mini_trainer.training.distributed import init_runtime, shutdown

    runtime = init_runtime()
    try:
        return train(args, runtime)
    finally:
        shutdown()


def train(args: TrainingArgs, runtime) -> int:
    from transformers import get_scheduler

    from mini_trainer.batching.collator import collate_packed, plan_step
    from mini_trainer.batching.sampler import BatchSampler, should_stop
    from mini_trainer.training import checkpoint
    from mini_trainer.training.distributed import all_reduce_max, all_reduce_sum, broadcast_object
    from mini_trainer.training.loss import make_loss_fn
    from mini_trainer.training.metrics import MetricsLogger, peak_memory_gb, truncate_metrics
    from mini_trainer.training.model_setup import build_model
    from mini_trainer.training.preemption import EXIT_PREEMPTED, StopRequest

    out = Path(args.output_dir)
    stop_request = StopRequest()
    seed_everything(args.seed + runtime.rank)

    dataset = load_dataset(args, runtime)
    loss_fn = make_loss_fn(args.use_liger_kernels, runtime.device.type)
    model, config = build_model(
        args.model_name_or_path, loss_fn, runtime, args.activation_checkpointing, args.cpu_offload
    )
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0

    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=args.learning_rate,
        betas=(args.beta1, args.beta2),
        eps=args.eps,
        weight_decay=args.weight_decay,
    )
    total_steps = planned_steps(args, len(dataset))
    scheduler = get_scheduler(
        args.lr_scheduler,
        optimizer,
        num_warmup_steps=args.num_warmup_steps,
        num_training_steps=total_steps,
    )
    sampler = BatchSampler(len(dataset), args.batch_size, args.seed)
    progress = Progress()

    # Rank 0 picks the state, so every rank loads the same one even on a lagging file system.
    newest = checkpoint.newest_state(out) if args.resume and runtime.is_main else None
    resumed_from = broadcast_object(newest, runtime)
    if resumed_from is not None:
        saved = checkpoint.load_state(resumed_from, model, optimizer, runtime)
        scheduler.load_state_dict(saved["scheduler"])
        try:
            sampler.load_state_dict(saved["sampler"])
        except ValueError as error:
            raise UserError(f"{resumed_from}: --resume: {error}") from None
        progress = Progress(**saved["progress"])
        log.info("resumed from %s (step %d)", resumed_from, progress.step)
    elif args.resume:
        log.info("--resume: no complete state under %s/state, starting from step 0", out)
    if runtime.is_main:
        out.mkdir(parents=True, exist_ok=True)
        checkpoint.remove_stale_temp_dirs(out)
        truncate_metrics(out / "metrics.jsonl", progress.step)
        atomic_write_text(out / "training_args.json", json.dumps(asdict(args), indent=2) + "\n")
        log.info(
            "%d samples, %d ranks on %s, %s steps planned",
            len(dataset), runtime.world_size, runtime.device, total_steps or "open-ended",
        )  # fmt: skip
    logger = MetricsLogger(out, args, total_steps, progress.step) if runtime.is_main else None

    def save_state() -> None:
        trainer_state = {
            "progress": asdict(progress),
            "sampler": sampler.state_dict(),
            "scheduler": scheduler.state_dict(),
        }
        checkpoint.save_state(
            out, progress.step, model, optimizer, trainer_state, runtime, args.keep_states
        )

    def save_hf(name: str) -> None:
        checkpoint.save_hf_checkpoint(
            model, config, args.model_name_or_path, out / name, args.save_dtype, runtime,
            training_args=asdict(args),
        )  # fmt: skip

    def finished() -> bool:
        capped = args.max_steps is not None and progress.step >= args.max_steps
        return capped or should_stop(
            args.training_mode,
            epochs_completed=sampler.epoch,
            steps=progress.step,
            loss_tokens=progress.loss_tokens_seen,
            max_epochs=args.max_epochs,
            max_steps=args.max_steps,
            max_tokens=args.max_tokens,
        )

    model.train()
    try:
        while not finished():
            started = time.perf_counter()
            batch = sampler.next_batch()
            plan = plan_step(
                batch.indices,
                dataset.lengths,
                dataset.loss_tokens,
                runtime.world_size,
                args.max_tokens_per_gpu,
            )
            # FSDP averages gradients over ranks; scaling by world size makes that a sum.
            scale = runtime.world_size / plan.batch_num_loss_tokens
            loss_sum = torch.zeros((), dtype=torch.float64, device=runtime.device)
            for ranks in plan.micro_batches:
                samples = [dataset[i] for i in ranks[runtime.rank]]
                micro = collate_packed(samples, plan.batch_num_loss_tokens, pad_id).to(
                    runtime.device
                )
                loss = model(micro.input_ids, micro.position_ids, micro.target_ids)
                (loss * scale).backward()
                loss_sum += loss.detach().double()

            max_norm = args.grad_clip if args.grad_clip > 0 else math.inf
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)

            (total_loss,) = all_reduce_sum([loss_sum.item()], runtime)
            # One collective for the peak memory and for "has any rank been asked to stop?".
            peak_gb, stop_flag = all_reduce_max(
                [peak_memory_gb(runtime.device), float(stop_request.requested)], runtime
            )
            step_time = time.perf_counter() - started
            progress.step += 1
            progress.samples_seen += len(batch.indices)
            progress.loss_tokens_seen += plan.batch_num_loss_tokens
            if logger is not None:
                logger.log({
                    "step": progress.step,
                    "epoch": batch.epoch,
                    "loss": total_loss / plan.batch_num_loss_tokens,
                    "lr": lr,
                    "grad_norm": float(grad_norm),
                    "num_loss_tokens": plan.batch_num_loss_tokens,
                    "num_tokens": plan.num_tokens,
                    "num_micro_batches": plan.num_micro_batches,
                    "samples_seen": progress.samples_seen,
                    "tokens_per_second": plan.num_tokens / step_time,
                    "step_time_s": step_time,
                    "peak_memory_gb": peak_gb,
                    "timestamp": time.time(),
                })  # fmt: skip

            samples_since = progress.samples_seen - progress.samples_at_last_checkpoint
            due_by_samples = bool(args.min_samples_per_checkpoint) and (
                samples_since >= args.min_samples_per_checkpoint
            )
            if due_by_samples or (args.checkpoint_at_epoch and batch.ends_epoch):
                save_hf(f"hf_format/samples_{progress.samples_seen}")
                progress.samples_at_last_checkpoint = progress.samples_seen
            state_due = bool(args.save_every_steps) and progress.step % args.save_every_steps == 0
            if state_due or stop_flag:
                save_state()
            if stop_flag:
                log.warning(
                    "stopped by %s after step %d; state saved; exit status %d (run with --resume)",
                    stop_request.signal_name or "a signal on another rank",
                    progress.step,
                    EXIT_PREEMPTED,
                )
                return EXIT_PREEMPTED
    finally:
        if logger is not None:
            logger.close()

    if args.save_final_checkpoint:
        save_hf("final")
    log.info("done: %d steps, %d samples", progress.step, progress.samples_seen)
    return 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def planned_steps(args: TrainingArgs, num_samples: int) -> int | None:
    """Optimizer steps the run will take, when the training mode fixes them."""
    if args.training_mode == "epoch":
        epoch_steps = math.ceil(num_samples / args.batch_size) * args.max_epochs
        return min(epoch_steps, args.max_steps or epoch_steps)
    if args.max_steps:  # step mode, or a cap on token and infinite modes
        return args.max_steps
    if args.scheduler_needs_total_steps:
        raise UserError(
            f"--lr-scheduler {args.lr_scheduler}: needs a known number of steps; use "
            "--training-mode epoch or step, or give --max-steps"
        )
    return None


def load_dataset(args: TrainingArgs, runtime):
    """The index-backed dataset; without --data-index, rank 0 builds the index (same checks)."""
    from mini_trainer.data.dataset import IndexedJsonlDataset
    from mini_trainer.data.index_file import read_index_metadata
    from mini_trainer.data.validate import build_index, read_vocab_size
    from mini_trainer.training.distributed import broadcast_object

    if args.data_index:
        dataset = IndexedJsonlDataset.open(args.data_path, args.data_index)
        checked = read_index_metadata(args.data_index).get("vocab_size")
        model_vocab = read_vocab_size(args.model_name_or_path)
        if checked is None or checked > model_vocab:
            raise UserError(
                f"{args.data_index}: --data-index: token ids were checked against a vocabulary "
                f"of {checked}, but the model has {model_vocab} (validate with this model)"
            )
        longest = int(dataset.lengths.max())
        if longest > args.max_tokens_per_gpu:
            raise UserError(
                f"{args.data_index}: --data-index: holds a {longest}-token sample, more than "
                f"--max-tokens-per-gpu {args.max_tokens_per_gpu} (validate with that cap)"
            )
        return dataset
    outcome = None
    if runtime.is_main:
        try:
            vocab_size = read_vocab_size(args.model_name_or_path)
            index, _ = build_index(args.data_path, vocab_size, args.max_tokens_per_gpu)
            outcome = ("ok", index)
        except UserError as error:
            hint = (
                "to skip samples over the cap: mini-trainer validate DATA --on-long drop "
                "--out-index F.parquet ..., then train with --data-index F.parquet"
            )
            long_samples = any("more than --max-tokens-per-gpu" in line for line in error.lines)
            outcome = ("error", [*error.lines, hint] if long_samples else error.lines)
    status, payload = broadcast_object(outcome, runtime)
    if status == "error":
        raise UserError(*payload)
    return IndexedJsonlDataset(args.data_path, payload)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
