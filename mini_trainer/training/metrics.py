"""Rank 0's view of training: `metrics.jsonl`, a progress display and optional wandb."""

from __future__ import annotations

import json
import logging
import resource
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_write_text

log = logging.getLogger("mini_trainer")

METRIC_FIELDS = (
    "step", "epoch", "loss", "lr", "grad_norm", "num_loss_tokens", "num_tokens",
    "num_micro_batches", "samples_seen", "tokens_per_second", "step_time_s", "peak_memory_gb",
    "timestamp", "tokens_per_second_per_device", "tflops_per_device", "mfu",
)  # fmt: skip
MEASURED_FIELDS = (
    "tokens_per_second", "step_time_s", "peak_memory_gb", "timestamp",
    "tokens_per_second_per_device", "tflops_per_device", "mfu", "val_time_s", "elapsed_s",
)  # fmt: skip
"""Fields of metrics.jsonl and of an evaluation's JSON that measure the machine (time, speed,
memory), not the computation: the only ones in which two runs of one command differ on one
machine (tests/test_reproducible.py; docs/training.md, Reproducibility)."""


def peak_memory_gb(device: torch.device) -> float:
    """Peak accelerator memory, or this process's peak resident memory on the CPU, in GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1024**3
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB on Linux


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop rows after `last_step` (written after the state a resumed run restarts from)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a line torn by the crash that the resume recovers from
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def format_eta(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


class MetricsLogger:
    """Writes one JSON object per optimizer step; shows progress; mirrors rows to wandb.

    Only rank 0 creates one. The progress display is a tqdm bar on a terminal and one plain
    line per step otherwise (logs, Slurm, Snakemake).
    """

    def __init__(self, out_dir: Path, args, total_steps: int | None, start_step: int):
        self.path = out_dir / "metrics.jsonl"
        self.total_steps = total_steps
        self.start_step = start_step
        self.started = time.perf_counter()
        self.bar = None
        if sys.stderr.isatty():
            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)
        self.wandb_run = _start_wandb(args) if args.wandb_project else None
        self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def log(self, row: dict) -> None:
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
        summary = (
            f"loss {row['loss']:.4f} lr {row['lr']:.2e} "
            f"{row['tokens_per_second']:.0f} tok/s grad {row['grad_norm']:.3f}"
        )
        if "val_loss" in row:  # a validation step (training/validation.py)
            summary += f" val_loss {row['val_loss']:.4f} val_acc {row['val_token_accuracy']:.3f}"
        if self.bar is not None:
            self.bar.set_postfix_str(summary, refresh=False)
            self.bar.update(1)
            return
        done = row["step"] - self.start_step
        total = f"/{self.total_steps}" if self.total_steps else ""
        eta = ""
        if self.total_steps and done:
            per_step = (time.perf_counter() - self.started) / done
            eta = f" eta {format_eta(per_step * (self.total_steps - row['step']))}"
        print(f"step {row['step']}{total} epoch {row['epoch']} {summary}{eta}", flush=True)

    def close(self) -> None:
        self.file.close()
        if self.bar is not None:
            self.bar.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def _start_wandb(args):
    try:
        # deferred: optional (wandb, --wandb-project)
        import wandb
    except ImportError:
        raise UserError(
            "--wandb-project: wandb is not installed (pip install 'mini-trainer[wandb]')"
        ) from None
    return wandb.init(
        project=args.wandb_project,
        name=args.wandb_run_name,
        entity=args.wandb_entity,
        config=asdict(args),
        dir=args.output_dir,
    )
