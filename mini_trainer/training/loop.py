"""The training loop, in named phases: data, model, optimizer, resume, steps, export.

Each optimizer step takes `batch_size` samples; they are packed into micro-batches of at most
`max_tokens_per_gpu` tokens per rank; every micro-batch's summed token loss is divided by the
loss-token count of the whole global batch, so a step equals one big batch however it is split.
What differs between fine-tuning methods (full, OSFT) is behind `mini_trainer/method.py`'s hooks,
which every run calls at the same points.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from mini_trainer.batching.sampler import BatchSampler
from mini_trainer.distributed.context_groups import context_groups
from mini_trainer.distributed.preemption import EXIT_PREEMPTED, StopRequest
from mini_trainer.distributed.run_lock import lock_output_dir
from mini_trainer.distributed.runtime import Runtime, all_reduce_max, all_reduce_sum
from mini_trainer.errors import UserError
from mini_trainer.method import MethodContext, write_description
from mini_trainer.models.moe import RouterStats, routing, step_fields
from mini_trainer.training import async_save, checkpoint, divergence, resume
from mini_trainer.training.async_save import BackgroundWriter
from mini_trainer.training.attention import attention_kwargs
from mini_trainer.training.checkpoint_policy import checkpoints_due
from mini_trainer.training.data_setup import load_dataset
from mini_trainer.training.divergence import check_step
from mini_trainer.training.fingerprint import run_fingerprint
from mini_trainer.training.flops import ModelFlops
from mini_trainer.training.loss import make_loss_fn
from mini_trainer.training.memory_probe import memory_probe
from mini_trainer.training.method import make_method
from mini_trainer.training.metrics import MetricsLogger, peak_memory_gb, truncate_metrics
from mini_trainer.training.model_setup import ModelSpec, build_model
from mini_trainer.training.optimizer import build_optimizer, build_scheduler, finish_gradients
from mini_trainer.training.prefetch import StepPrefetcher
from mini_trainer.training.run_folder import recording_bad_input
from mini_trainer.training.save_guard import write_errors
from mini_trainer.training.stopping import finished, planned_steps
from mini_trainer.training.trainer_state import Progress, TrainerState
from mini_trainer.training.validation import Validator
from mini_trainer.training_args import TrainingArgs

log = logging.getLogger("mini_trainer")


@dataclass
class StepResult:
    """What one optimizer step measured, on every rank (already reduced over ranks)."""

    loss_sum: float
    grad_norm: float
    lr: float
    peak_memory_gb: float
    stop_requested: bool
    routed: dict | None = None
    """A mixture of experts' `aux_loss` and `expert_tokens` (models/moe.py), else None."""
    method: dict | None = None
    """The method's own figures of the step (`TrainingMethod.step_metrics`), else None."""


def train(args: TrainingArgs, runtime: Runtime) -> int:
    """Run the job to its end (0) or to a requested stop (EXIT_PREEMPTED, state saved)."""
    out = Path(args.output_dir)
    lock_output_dir(out, runtime)  # one job per output folder, for the job's life
    stop_request = StopRequest()
    seed_everything(args.seed + runtime.rank)
    groups = context_groups(runtime, args.context_parallel)  # None without --context-parallel

    # -- data
    dataset = load_dataset(args, runtime)
    total_steps = planned_steps(args, len(dataset))
    sampler = BatchSampler(len(dataset), args.batch_size, args.seed)
    validator = Validator(args, runtime) if args.validation_data_path else None
    # rank 0 picks an intact state of this same run (or moves an unsaved attempt aside) before
    # any model loads
    run_print = run_fingerprint(args, dataset, runtime.world_size) if runtime.is_main else None
    resumed_from = resume.pick_state(out, args.resume, run_print, runtime)

    # -- model (the method adapts it before sharding)
    method = make_method(args)
    loss_fn = make_loss_fn(args.use_liger_kernels, runtime.device.type)
    context = MethodContext(runtime=runtime, out=out, resumed_from=resumed_from)
    model, config = build_model(
        ModelSpec.of(args), loss_fn, runtime, method, context,
        context_group=groups.group if groups else None,
    )  # fmt: skip
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0

    # -- optimizer
    optimizer = build_optimizer(args, method.param_groups(model, args.weight_decay))
    scheduler = build_scheduler(args, optimizer, total_steps)
    probe = memory_probe(model, optimizer, runtime.rank)  # benchmarks/plan.py; off unless asked

    # -- resume (the state was chosen after the data phase)
    saved = restore(resumed_from, model, optimizer, scheduler, sampler, runtime)
    progress = saved.progress
    if validator is not None:
        validator.load_state_dict(saved.validation)
    if runtime.is_main:
        start_record(out, args, resumed_from, progress.step)
        write_description(method, out)
        log.info(
            "%d samples, %d ranks on %s, %s steps planned",
            len(dataset), runtime.world_size, runtime.device, total_steps or "open-ended",
        )  # fmt: skip
    logger = MetricsLogger(out, args, total_steps, progress.step) if runtime.is_main else None
    background = async_save.decide_for_run(args, model, optimizer, runtime)
    if runtime.is_main:
        log.info("%s", background.line)
    saver = Saver(out, args, model, optimizer, config, method, runtime, background.on)

    # -- steps (the next steps' micro-batches are prepared in a background thread)
    model.train()
    prefetcher = StepPrefetcher(
        sampler, dataset, rank=groups.dp_rank if groups else runtime.rank,
        world_size=groups.dp_size if groups else runtime.world_size,
        max_tokens_per_rank=args.row_tokens, pad_id=pad_id, pin_memory=runtime.is_cuda,
        device=runtime.device, context_split=(groups.size, groups.rank) if groups else None,
    )  # fmt: skip
    step_metrics = StepMetrics(model, dataset, runtime)
    with recording_bad_input(out, progress):  # then the same command may run again
        try:
            while not finished(
                args,
                steps=progress.step,
                epochs_completed=sampler.epoch,
                loss_tokens=progress.loss_tokens_seen,
            ) and not (validator is not None and validator.should_stop):
                started = time.perf_counter()
                batch = sampler.next_batch()
                plan, micro_batches = prefetcher.prepare(batch)
                result = train_step(
                    model, optimizer, scheduler, method, plan, micro_batches, args, runtime,
                    stop_request,
                )  # fmt: skip
                step_time = time.perf_counter() - started
                progress.step += 1
                progress.samples_seen += len(batch.indices)
                progress.loss_tokens_seen += plan.batch_num_loss_tokens
                val_row = {}
                if validator is not None:  # after the step, before its row: the row carries val_*
                    last = finished(args, steps=progress.step, epochs_completed=sampler.epoch,
                                    loss_tokens=progress.loss_tokens_seen)  # fmt: skip
                    val_row = validator.after_step(
                        model, pad_id, progress.step, last, saver.save_hf
                    )
                if logger is not None:
                    row = step_metrics.row(progress, batch, plan, result, step_time)
                    logger.log({**row, **val_row})

                # -- after the step: checkpoints that are due
                due = checkpoints_due(
                    args,
                    step=progress.step,
                    samples_seen=progress.samples_seen,
                    samples_at_last_checkpoint=progress.samples_at_last_checkpoint,
                    ends_epoch=batch.ends_epoch,
                    stop_requested=result.stop_requested,
                )
                saver.save_due(due, progress, sampler, scheduler, run_print, validator)
                if result.stop_requested:
                    saver.finish_pending()  # exit 75 only with the state published
                    log.warning(
                        "stopped by %s after step %d; state saved; exit status %d "
                        "(run with --resume)",
                        stop_request.signal_name or "a signal on another rank",
                        progress.step,
                        EXIT_PREEMPTED,
                    )
                    return EXIT_PREEMPTED
        except divergence.Diverged as error:
            # The last good state may still be in its background write: published before the
            # message names the newest state (every rank is here: the check is all-reduced).
            saver.finish_pending(last=True)
            raise error.at_step(progress.step + 1, out) from None
        finally:
            probe.close()
            prefetcher.close()
            if logger is not None:
                logger.close()

        # -- export (a background state write finishes first: the run ends with it published;
        # its host copy is freed for the export)
        saver.finish_pending(last=True)
        if args.save_final_checkpoint:
            saver.save_hf("final")
            if args.drop_states_after_final:  # nothing reads a finished run's states
                checkpoint.drop_states(out, runtime)
    log.info("done: %d steps, %d samples", progress.step, progress.samples_seen)
    return 0


def restore(resumed_from, model, optimizer, scheduler, sampler, runtime: Runtime) -> TrainerState:
    """Load the chosen state into the model, optimizer, scheduler and sampler; return it (a fresh
    one when starting from step 0)."""
    if resumed_from is None:
        return TrainerState()
    saved = checkpoint.load_state(resumed_from, model, optimizer, runtime)
    scheduler.load_state_dict(saved.scheduler)
    try:
        sampler.load_state_dict(saved.sampler)
    except ValueError as error:
        raise UserError(f"{resumed_from}: --resume: {error}") from None
    log.info("resumed from %s (step %d)", resumed_from, saved.progress.step)
    return saved


def start_record(out: Path, args: TrainingArgs, resumed_from, step: int) -> None:
    """Rank 0: clean up a crashed save's leftovers, rewind metrics, record the start."""
    out.mkdir(parents=True, exist_ok=True)
    checkpoint.remove_stale_temp_dirs(out)
    truncate_metrics(out / "metrics.jsonl", step)
    resume.record_start(out, args, resumed_from, step)


class Saver:
    """Writes the run's checkpoints: HF exports and training states, failures as one line."""

    def __init__(self, out: Path, args: TrainingArgs, model, optimizer, config, method, runtime,
                 background: bool):  # fmt: skip
        self.out, self.args, self.model, self.optimizer = out, args, model, optimizer
        self.config, self.method, self.runtime = config, method, runtime
        # async saves (`background`, async_save.decide_for_run): states are written by a
        # background thread (made on every rank here)
        self.writer = BackgroundWriter(pin=runtime.is_cuda) if background else None

    def save_state(self, trainer_state: TrainerState) -> None:
        step = trainer_state.progress.step
        divergence.check_weights(self.model, self.runtime)
        self.finish_pending()  # at most one save in flight
        with write_errors(self.out, f"state/step_{step}", self.runtime):
            checkpoint.save_state(
                self.out, step, self.model, self.optimizer, trainer_state, self.runtime,
                self.args.keep_states, self.writer,
            )  # fmt: skip

    def finish_pending(self, last: bool = False) -> None:
        """Wait for the background state write in flight, if any; its failure is one line.
        `last`: no state is saved after this, so the staged copy's host memory is freed."""
        if self.writer is None:
            return
        if self.writer.in_flight is not None:
            with write_errors(self.out, self.writer.in_flight, self.runtime):
                self.writer.wait()
        if last:
            self.writer.release()

    def save_due(self, due, progress: Progress, sampler, scheduler, fingerprint, validator) -> None:
        """Write what `checkpoints_due` asked for after a step: exports, then the state."""
        for name in due.exports:
            self.save_hf(name)
            progress.samples_at_last_checkpoint = progress.samples_seen
        if due.state:
            self.save_state(
                TrainerState(
                    progress=replace(progress),
                    sampler=sampler.state_dict(),
                    scheduler=scheduler.state_dict(),
                    fingerprint=fingerprint,
                    validation=validator.state_dict() if validator is not None else None,
                )
            )

    def save_hf(self, name: str, extra_json: dict | None = None) -> None:
        divergence.check_weights(self.model, self.runtime)
        with write_errors(self.out, name, self.runtime):
            checkpoint.save_hf_checkpoint(
                self.model, self.config, self.args.model_name_or_path, self.out / name,
                self.args.save_dtype, self.runtime, self.method.export_weights,
                training_args=asdict(self.args), extra_json=extra_json,
            )  # fmt: skip


class StepMetrics:
    """One `metrics.jsonl` row per step (rank 0), with the model's FLOPs figures."""

    def __init__(self, model, dataset, runtime: Runtime):
        device_name = torch.cuda.get_device_name(runtime.device) if runtime.is_cuda else None
        self.flops = ModelFlops.of(model.model, device_name)
        self.dataset, self.world_size = dataset, runtime.world_size

    def row(self, progress: Progress, batch, plan, result: StepResult, step_time: float) -> dict:
        lengths = self.dataset.lengths[batch.indices].astype(np.int64)
        return {
            "step": progress.step,
            "epoch": batch.epoch,
            "loss": result.loss_sum / plan.batch_num_loss_tokens,
            "lr": result.lr,
            "grad_norm": result.grad_norm,
            "num_loss_tokens": plan.batch_num_loss_tokens,
            "num_tokens": plan.num_tokens,
            "num_micro_batches": plan.num_micro_batches,
            "samples_seen": progress.samples_seen,
            "tokens_per_second": plan.num_tokens / step_time,
            "step_time_s": step_time,
            "peak_memory_gb": result.peak_memory_gb,
            "timestamp": time.time(),
            **self.flops.step_metrics(
                plan.num_tokens, int((lengths**2).sum()), step_time, self.world_size
            ),
            **(result.routed or {}),
            **(result.method or {}),
        }


def train_step(
    model, optimizer, scheduler, method, plan, micro_batches, args, runtime, stop_request
) -> StepResult:
    """One optimizer step over this rank's micro-batches of `plan`: forward/backward each, then
    update. No host sync until the step's end: boundaries and loss rows come from the host."""
    attention = model.model.config._attn_implementation
    # FSDP averages gradients over ranks; scaling by world size makes that a sum.
    scale = runtime.world_size / plan.batch_num_loss_tokens
    loss_sum = torch.zeros((), dtype=torch.float64, device=runtime.device)
    routes = routing(model.model)
    router = RouterStats(routes, runtime.device) if routes is not None else None
    for index, host_micro in enumerate(micro_batches):
        micro = host_micro.to(runtime.device, non_blocking=runtime.is_cuda)
        if args.defer_grad_sync:  # reduce-scatter only after the step's last micro-batch
            model.set_requires_gradient_sync(index == len(micro_batches) - 1)
        kwargs = attention_kwargs(attention, micro)
        loss = model(
            micro.input_ids, micro.position_ids, micro.target_ids, loss_rows=micro.loss_rows,
            loss_fn=method.micro_batch_loss(micro, kwargs), router=router, **kwargs,
        )  # fmt: skip
        (loss * scale).backward()
        loss_sum += loss.detach().double()

    grad_norm = finish_gradients(model, method, args.grad_clip)
    (total_loss,) = all_reduce_sum([loss_sum.item()], runtime)
    routed = {}
    if router is not None:  # the logged loss is the LM's; the aux term is logged apart
        totals = all_reduce_sum(router.totals.tolist(), runtime)
        routed = step_fields(totals, plan.batch_num_loss_tokens)
        total_loss -= totals[1]
    check_step(total_loss, float(grad_norm))  # before the update: a NaN never reaches weights
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    method.after_optimizer_step(model)
    method_figures = method.step_metrics()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)

    # One collective for the peak memory and for "has any rank been asked to stop?".
    peak_gb, stop_flag = all_reduce_max(
        [peak_memory_gb(runtime.device), float(stop_request.requested)], runtime
    )
    return StepResult(
        loss_sum=total_loss,
        grad_norm=float(grad_norm),
        lr=lr,
        peak_memory_gb=peak_gb,
        stop_requested=bool(stop_flag),
        routed=routed or None,
        method=method_figures or None,
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
