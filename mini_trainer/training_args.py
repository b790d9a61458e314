"""`TrainingArgs`: the training job's arguments, validated once (the launcher's own are in
`launch_args`).

Every `TrainingArgs` field is a `--kebab-case` flag of `python -m mini_trainer.train` (and of
`mini-trainer train`); `to_cli_args` turns the dataclass back into those flags, so the Python API
forwards every field by construction. Each field's help text lives in its metadata and is the
flag's `--help`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any

from mini_trainer import async_save_options
from mini_trainer.errors import UserError
from mini_trainer.methods import METHOD_NAMES, METHODS, REGISTERED
from mini_trainer.methods.options import MethodOptions, option
from mini_trainer.methods.osft import OSFT_RANK_MODES  # noqa: F401 (its old home)
from mini_trainer.optimizer_options import OPTIMIZERS, PARAM_DTYPES, optimizer_problems
from mini_trainer.validation_options import (
    VAL_METRICS,
    validation_problems,
    validation_warnings,
)

SCHEDULERS = (
    "constant",
    "constant_with_warmup",
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "inverse_sqrt",
)
"""transformers schedulers that need nothing beyond warm-up and total steps."""

SCHEDULERS_NEEDING_TOTAL = ("linear", "cosine", "cosine_with_restarts", "polynomial")
TRAINING_MODES = ("epoch", "step", "token", "infinite")
SAVE_DTYPES = ("float32", "bfloat16", "float16")
RESUME_AUTO = "auto"
"""`--resume auto`: start, continue, or move an unsaved attempt aside (training/run_folder.py)."""


_arg = option
"""A field with its flag's help and checks' metadata (`methods/options.py`)."""


@dataclass
class _RunOptions:
    """The options every method shares (each method's own are its group's, `methods/`)."""

    model_name_or_path: str = _arg(
        help="Model to fine-tune: a local Hugging Face folder, or a Hub id ORG/NAME."
    )
    data_path: str = _arg(help="Pre-tokenized JSONL (input_ids, labels[, len]).")
    output_dir: str = _arg(help="Where checkpoints, state and metrics go.")
    model_revision: str = _arg(
        "main",
        "Hub id only: branch, tag or commit to fetch; the run records the commit it resolved to.",
    )
    batch_size: int = _arg(32, "Samples per optimizer step, over all ranks.", minimum=1)
    max_tokens_per_gpu: int = _arg(8192, "Token cap per rank per micro-batch.", minimum=1)
    context_parallel: int = _arg(
        1,
        "Split each packed row over groups of N ranks (zig-zag chunks, keys and values gathered "
        "in the group; docs/context_parallel.md): a row, and so a sample, may hold N x "
        "--max-tokens-per-gpu tokens. The number of ranks must be a multiple of N.",
        minimum=1,
    )
    learning_rate: float = _arg(1e-5, "Peak learning rate.", minimum=0)
    num_warmup_steps: int = _arg(0, "Linear warm-up steps of the scheduler.", minimum=0)
    lr_scheduler: str = _arg(
        "constant_with_warmup", f"One of: {', '.join(SCHEDULERS)}.", choices=SCHEDULERS
    )
    seed: int = _arg(42, "Seeds the sample order, and every rank's RNGs.", minimum=0)
    deterministic: bool = _arg(
        False,
        "Deterministic kernels on a GPU (torch's deterministic algorithms, cuBLAS's fixed "
        "workspace, cuDNN without benchmarking): the same bytes from the same command on one "
        "machine, at a cost (docs/gpu.md). On the CPU the run is reproducible without it; "
        "there it only makes an op with no deterministic version an error.",
    )
    use_liger_kernels: bool = _arg(False, "Liger fused linear cross-entropy (CUDA only).")
    method: str = _arg(
        "sft",
        f"Training method: {', '.join(METHOD_NAMES)} (docs/training.md); each method's own "
        "options need it (--osft is the same as --method osft).",
        choices=METHOD_NAMES,
    )
    max_epochs: int = _arg(1, "Epochs to train (training mode epoch).", minimum=1)
    max_steps: int | None = _arg(
        None, "Optimizer steps to train (training mode step); in other modes, a cap.", minimum=1
    )
    max_tokens: int | None = _arg(None, "Loss tokens to train on (training mode token).", minimum=1)
    training_mode: str = _arg(
        "epoch", f"When to stop: {', '.join(TRAINING_MODES)}.", choices=TRAINING_MODES
    )
    checkpoint_at_epoch: bool = _arg(False, "Write hf_format/samples_<N>/ after every epoch.")
    min_samples_per_checkpoint: int | None = _arg(
        None,
        "Write hf_format/samples_<N>/ each time this many more samples have been seen.",
        minimum=1,
    )
    save_final_checkpoint: bool = _arg(
        False,
        "Write final/ when training ends (without it, and without the two flags above, "
        "the run writes no weights: a warning says so).",
    )
    wandb_project: str | None = _arg(None, "Log to this Weights & Biases project.")
    wandb_run_name: str | None = _arg(None, "Weights & Biases run name.")
    wandb_entity: str | None = _arg(None, "Weights & Biases entity (team or user).")
    data_index: str | None = _arg(
        None, "Lengths index from `mini-trainer validate`; built (same checks) when omitted."
    )
    resume: bool | str = _arg(
        False,
        "Continue from the newest intact state/step_<K>/ (a folder with nothing trained starts "
        "from step 0). `--resume auto` also takes a folder whose attempt saved no state: it is "
        "moved aside to OUT.unsaved-<UTC time> and the run starts over.",
        optional_value=RESUME_AUTO,
    )
    save_every_steps: int | None = _arg(
        None, "Write state/step_<K>/ every K optimizer steps.", minimum=1
    )
    keep_states: int = _arg(2, "Keep only the newest N state folders.", minimum=1)
    async_save: bool | None = _arg(
        None,
        "Write training states in the background: the state is copied to host memory (pinned "
        "on CUDA) and training goes on while a thread writes, hashes and publishes it; at most "
        "one save in flight; the end of the run and a stop wait for it (docs/training.md). "
        "--no-async-save (false in a pipeline config): write synchronously. Without either "
        "(left out of a config), on where the staged copy of the node's ranks fits in half of "
        "the node's available host memory (MemAvailable) at the start; rank 0 prints the "
        "decision and why.",
        negatable=True,
        default_text="auto",
    )
    drop_states_after_final: bool = _arg(
        False,
        "Delete state/ once final/ is written: a finished run keeps its weights, not its "
        "training states (the pipeline's default; standalone runs keep them unless asked). "
        "Needs --save-final-checkpoint.",
    )
    activation_checkpointing: bool = _arg(False, "Recompute activations in backward.")
    compile: bool = _arg(False, "torch.compile each decoder layer (docs/training.md).")
    cpu_offload: bool = _arg(False, "FSDP2 CPU offload of parameters and gradients (CUDA).")
    defer_grad_sync: bool = _arg(
        False,
        "Reduce-scatter gradients once per step, after its last micro-batch, instead of after "
        "every micro-batch: fewer collectives, but every rank holds the whole model's "
        "gradients unsharded (fp32) between micro-batches.",
    )
    save_dtype: str = _arg(
        "bfloat16", f"Dtype of exported weights: {', '.join(SAVE_DTYPES)}.", choices=SAVE_DTYPES
    )
    beta1: float = _arg(0.9, "AdamW beta1.", minimum=0, exclusive_maximum=1)
    beta2: float = _arg(0.95, "AdamW beta2.", minimum=0, exclusive_maximum=1)
    eps: float = _arg(1e-8, "AdamW epsilon.", exclusive_minimum=0)
    weight_decay: float = _arg(0.0, "AdamW decoupled weight decay.", minimum=0)
    grad_clip: float = _arg(1.0, "Clip the global gradient norm to this (0 disables).", minimum=0)
    optimizer: str = _arg(
        "adamw",
        "AdamW's moments: adamw (fp32), adamw-bf16 (bf16), adamw-8bit (torchao, block-quantized; "
        "its state resumes on the same number of ranks); adamw-4bit is refused "
        "(docs/training.md).",
        choices=OPTIMIZERS,
    )
    param_dtype: str = _arg(
        "fp32",
        "Dtype of the sharded master weights and gradients: fp32, or bf16 (updates applied with "
        "stochastic rounding; not with --osft).",
        choices=PARAM_DTYPES,
    )
    # validation during training (training/validation.py)
    validation_data_path: str | None = _arg(
        None,
        "Pre-tokenized JSONL scored during training (checked as the training data); its "
        "metrics go into metrics.jsonl as val_*.",
    )
    validation_every_steps: int | None = _arg(
        None, "Validate every N optimizer steps (and always after the last step).", minimum=1
    )
    validation_max_tokens_per_gpu: int | None = _arg(
        None,
        "Token cap per rank per validation micro-batch (default: --max-tokens-per-gpu).",
        minimum=1,
    )
    save_best: bool = _arg(
        False, "Keep OUT/best/: the HF folder of the best validation step so far."
    )
    best_metric: str = _arg(
        "val_loss",
        "Validation metric that picks the best step: val_loss or val_perplexity (lower is "
        "better), val_token_accuracy or val_exact_match (higher is better).",
        choices=tuple(VAL_METRICS),
    )
    early_stopping_patience: int | None = _arg(
        None, "End the run after K validations in a row without an improvement.", minimum=1
    )
    early_stopping_min_delta: float = _arg(
        0.0, "Least change of --best-metric that counts as an improvement.", minimum=0
    )


@dataclass
class TrainingArgs(*reversed(REGISTERED), _RunOptions):  # type: ignore[misc]
    """Arguments of one training job; see docs/training.md for the flags. The options shared
    by every method first, then each registered method's option group (`methods/`)."""

    def __post_init__(self) -> None:
        problems = list(self._select_method())
        problems += [] if problems else list(self._problems())
        if problems:
            raise UserError(*problems)

    def _problems(self):
        for name in ("model_name_or_path", "data_path", "output_dir"):
            if not getattr(self, name):
                yield f"--{_flag(name)}: required"
        for name in ("batch_size", "max_tokens_per_gpu", "keep_states"):
            if getattr(self, name) < 1:
                yield f"--{_flag(name)}: must be at least 1, got {getattr(self, name)}"
        for name in (
            "max_epochs",
            "max_steps",
            "max_tokens",
            "save_every_steps",
            "min_samples_per_checkpoint",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                yield f"--{_flag(name)}: must be at least 1, got {value}"
        if not (self.learning_rate >= 0 and math.isfinite(self.learning_rate)):
            yield f"--learning-rate: must be a finite number >= 0, got {self.learning_rate}"
        if self.num_warmup_steps < 0:
            yield f"--num-warmup-steps: must be >= 0, got {self.num_warmup_steps}"
        yield from _choice("lr_scheduler", self.lr_scheduler, SCHEDULERS)
        yield from _choice("training_mode", self.training_mode, TRAINING_MODES)
        yield from _choice("save_dtype", self.save_dtype, SAVE_DTYPES)
        if not (self.resume is True or self.resume is False or self.resume == RESUME_AUTO):
            yield f"--resume: unknown value {self.resume!r} (give no value, or {RESUME_AUTO})"
        if self.training_mode in TRAINING_MODES:
            needed = {"step": "max_steps", "token": "max_tokens"}
            limit = needed.get(self.training_mode)
            if limit and getattr(self, limit) is None:
                yield f"--{_flag(limit)}: required with --training-mode {self.training_mode}"
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                yield f"--{name}: must be in [0, 1), got {getattr(self, name)}"
        if self.eps <= 0:
            yield f"--eps: must be > 0, got {self.eps}"
        if self.weight_decay < 0:
            yield f"--weight-decay: must be >= 0, got {self.weight_decay}"
        if self.grad_clip < 0:
            yield f"--grad-clip: must be >= 0 (0 disables), got {self.grad_clip}"
        if self.seed < 0:
            yield f"--seed: must be >= 0, got {self.seed}"
        if self.max_steps is not None and self.num_warmup_steps > self.max_steps:
            yield (
                f"--num-warmup-steps: {self.num_warmup_steps} is more than --max-steps "
                f"{self.max_steps} (the learning rate would never reach its peak)"
            )
        yield from async_save_options.problems(self)
        if self.drop_states_after_final and not self.save_final_checkpoint:
            yield "--drop-states-after-final: needs --save-final-checkpoint"
        for group in REGISTERED:
            yield from group.method_problems(self, group.name == self.method)
        yield from self._context_parallel_problems()
        yield from optimizer_problems(self)
        yield from validation_problems(self)

    def _select_method(self):
        """`--osft` and `--method osft` are one choice: keep the two in step."""
        if self.method not in METHOD_NAMES:
            yield from _choice("method", self.method, METHOD_NAMES)
        elif self.osft and self.method == "sft":
            self.method = "osft"
        elif self.method == "osft":
            self.osft = True
        elif self.osft:
            yield f"--osft: is --method osft, and this run asks for --method {self.method}"

    def method_group(self) -> type[MethodOptions]:
        """The option group class of the selected method."""
        return METHODS[self.method]

    def _context_parallel_problems(self):
        if self.context_parallel < 1:
            yield f"--context-parallel: must be at least 1, got {self.context_parallel}"
        if self.context_parallel <= 1:
            return
        refused = {
            "osft": "--osft",
            "compile": "--compile",
            "validation_data_path": "--validation-data-path",
        }
        for name, flag in refused.items():
            if getattr(self, name):
                yield f"--context-parallel: not with {flag} (not supported yet)"
        if self.method not in ("sft", "osft"):
            yield f"--context-parallel: not with --method {self.method} (not supported yet)"

    @property
    def row_tokens(self) -> int:
        """The token budget of one packed row: a rank's, or a context-parallel group's."""
        return self.max_tokens_per_gpu * self.context_parallel

    def warnings(self) -> list[str]:
        """Legal but probably unintended settings, printed at the start of a run."""
        out = []
        exports = self.save_final_checkpoint or self.checkpoint_at_epoch or self.save_best
        if not (exports or self.min_samples_per_checkpoint):
            out.append(
                "no weights will be written (only training states, with --save-every-steps): "
                "pass --save-final-checkpoint to get OUT/final/"
            )
        out += validation_warnings(self)
        return out

    @property
    def scheduler_needs_total_steps(self) -> bool:
        return self.lr_scheduler in SCHEDULERS_NEEDING_TOTAL


NEGATABLE = frozenset(
    f.name for f in dataclasses.fields(TrainingArgs) if f.metadata.get("negatable")
)
"""Options with a `--no-` flag (False given), beside the plain one (True); None: neither."""


def _choice(name: str, value: str, choices: tuple[str, ...]):
    if value not in choices:
        yield f"--{_flag(name)}: unknown value {value!r} (one of {', '.join(choices)})"


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _base_type(annotation: Any) -> type:
    """`int | None` -> int, `list[str] | None` -> list."""
    hint = annotation
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return typing.get_origin(hint) or hint


def _field_types() -> dict[str, type]:
    hints = typing.get_type_hints(TrainingArgs)
    return {f.name: _base_type(hints[f.name]) for f in dataclasses.fields(TrainingArgs)}


def _group_of(name: str) -> type[MethodOptions] | None:
    """The method whose option group declares field `name` (None: a shared option)."""
    for group in REGISTERED:
        if any(f.name == name for f in group.own_fields()):
            return group
    return None


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (a UserError) instead of the 40-line usage, and
    the same line whichever command parsed it (train, launch, plan, run_training)."""

    def error(self, message: str):
        raise UserError(f"{message} (see mini-trainer train --help)")


def build_parser(prog: str = "python -m mini_trainer.train") -> argparse.ArgumentParser:
    """The argparse parser of the training job, generated from `TrainingArgs`."""
    parser = _Parser(
        prog=prog,
        description="Full fine-tuning job, one process per GPU (or per CPU slot with gloo). "
        "`mini-trainer train --nproc-per-node N FLAGS` starts the N processes itself (also "
        "--nnodes, --node-rank, --rdzv-endpoint, --rdzv-id for several nodes, and "
        "--rdzv-conf is_host=true|false and --local-addr ADDRESS where host names do not "
        "resolve to the node's own address: see docs/slurm.md), forwards "
        "SIGTERM/SIGINT/SIGUSR1 to them and prints each error once; or run one process per "
        "rank under torchrun: torchrun --nproc-per-node N -m mini_trainer.train FLAGS.",
        epilog="Exit status: 0 done; 2 bad input (one line per problem); 3 training diverged "
        "(non-finite loss, gradient norm or weights); 75 stopped by a signal with a state saved "
        "(run again with --resume); 1 anything else. Without --save-final-checkpoint (or "
        "--checkpoint-at-epoch / --min-samples-per-checkpoint) no weights are written.",
        argument_default=argparse.SUPPRESS,
    )
    types_by_name = _field_types()
    for f in dataclasses.fields(TrainingArgs):
        kind = types_by_name[f.name]
        flag = f"--{_flag(f.name)}"
        help_text = f.metadata["help"]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        group = _group_of(f.name)
        if group is not None and f.name != group.name:
            help_text += f" Needs {group.needs_flag()}."
        if required:
            help_text += " (required)"
        elif "default_text" in f.metadata:
            help_text += f" (default: {f.metadata['default_text']})"
        elif f.default not in (None, False):
            help_text += f" (default: {f.default})"
        if kind is bool and "optional_value" in f.metadata:  # --resume, or --resume auto
            parser.add_argument(flag, nargs="?", const=True, help=help_text)
        elif kind is bool and f.metadata.get("negatable"):  # --async-save / --no-async-save
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        elif kind is bool:
            parser.add_argument(flag, action="store_true", help=help_text)
        elif kind is list:
            parser.add_argument(flag, nargs="+", help=help_text)
        else:
            parser.add_argument(flag, type=kind, required=required, help=help_text)
    return parser


def _join_negative_numbers(argv: list[str]) -> list[str]:
    """`--flag -1e-3` -> `--flag=-1e-3`: argparse takes "-1e-3" for an option otherwise, and the
    user would get "expected one argument" instead of the value's own check."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and token.startswith("-"):
            try:
                float(token)
            except ValueError:
                pass
            else:
                out[-1] = f"{out[-1]}={token}"
                continue
        out.append(token)
    return out


def parse_training_args(argv: list[str] | None = None) -> TrainingArgs:
    """Parse flags into a validated `TrainingArgs`; a bad flag is a `UserError` (one line)."""
    argv = _join_negative_numbers(list(sys.argv[1:] if argv is None else argv))
    namespace = build_parser().parse_args(argv)
    return TrainingArgs(**vars(namespace))


def to_cli_args(args: TrainingArgs) -> list[str]:
    """The flags that `parse_training_args` turns back into `args` (every field)."""
    out: list[str] = []
    types_by_name = _field_types()
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        flag = f"--{_flag(f.name)}"
        if types_by_name[f.name] is bool:
            if value:
                out += [flag] if value is True else [flag, str(value)]
            elif value is False and f.metadata.get("negatable"):
                out.append(f"--no-{_flag(f.name)}")
        elif value is None:
            continue
        elif isinstance(value, list):
            out += [flag, *map(str, value)]
        else:
            out += [flag, repr(value) if isinstance(value, float) else str(value)]
    return out
