"""The seam between the training loop and a fine-tuning method: what a method is.

The loop (`training/loop.py`) is the same for every method; what differs is a handful of hooks,
each called at one named point of a run. Plain full fine-tuning (`FullFineTuning`) implements
them as no-ops or plain defaults; OSFT implements them with its factorization and projections.
A method never branches the loop: the loop calls every hook on every run.

Every method satisfies the `TrainingMethod` protocol. The one hook that needs facts about the
run gets them in a `MethodContext` (runtime, output folder, the state resumed from), never from
globals or the arguments; `describe()` is written to `OUT/method.json` (`write_description`).
This module imports no method and no part of the loop: OSFT (`osft/method.py`) implements the
protocol here, and `training/method.py`'s `make_method` builds the method a run names
(`--method`, registered in `mini_trainer/methods/`) from the run's `TrainingArgs`.

Order of the hooks in a run:
1. `adapt_model(model, context)`: on the meta-device model, before FSDP2 shards it (swap or add
   modules, freeze parameters); collective: every rank calls it.
2. `convert_weights(state)`: on rank 0, the dense checkpoint's fp32 tensors become the adapted
   model's state (e.g. dense W to factors); the result is broadcast into the shards.
3. `param_groups(model, weight_decay)`: what the optimizer trains, and with which decay.
   Per micro-batch: `micro_batch_loss(micro, attention_kwargs)`, the loss it trains on (None:
   the model's own; LwF: cross-entropy plus the distillation term from its teacher).
4. per step: `before_optimizer_step(model)` once the gradients are summed over micro-batches
   and ranks, before the clip (so the clip and the logged norm see what the hook leaves), and
   `after_optimizer_step(model)` after `optimizer.step()`.
5. `export_weights(state)`: the adapted model's full state back to dense Hugging Face weights,
   for `hf_format/` and `final/`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from torch import Tensor, nn

from mini_trainer.distributed.runtime import Runtime
from mini_trainer.io_utils import atomic_write_text

DESCRIPTION_FILE = "method.json"
"""`OUT/method.json`: the method's `describe()`, beside training_args.json (rank 0, at start)."""


@dataclass(frozen=True)
class MethodContext:
    """What a method may know about the run it is part of."""

    runtime: Runtime | None
    """This process in the job; None for a lone process without a process group (tests)."""
    out: Path
    """The run's output folder."""
    resumed_from: Path | None
    """The saved state this run continues from (`OUT/state/step_K`), or None for a fresh start."""

    @property
    def is_main(self) -> bool:
        return self.runtime is None or self.runtime.is_main


@runtime_checkable
class TrainingMethod(Protocol):
    """The hooks the training loop calls, in the order the module docstring lists."""

    name: str
    state_bytes_per_trainable: int
    """Bytes the method keeps per trainable element, sharded as the weights (the plan's line)."""

    def adapt_model(self, model: nn.Module, context: MethodContext | None = None) -> None: ...

    def convert_weights(self, state: dict[str, Tensor]) -> dict[str, Tensor]: ...

    def param_groups(self, model: nn.Module, weight_decay: float) -> list[dict]: ...

    def micro_batch_loss(self, micro, attention_kwargs: dict):
        """The loss this micro-batch trains on (a `training/loss.py` LossFn, which may close over
        what the method computed for it, e.g. LwF's teacher), or None for the model's own."""
        ...

    def before_optimizer_step(self, model: nn.Module) -> None: ...

    def after_optimizer_step(self, model: nn.Module) -> None: ...

    def export_weights(self, state: dict[str, Tensor]) -> dict[str, Tensor]: ...

    def step_metrics(self) -> dict[str, float]:
        """The method's own figures of the step just taken, for its metrics.jsonl row (every
        rank calls it after `after_optimizer_step`; it may reduce over ranks)."""
        ...

    def describe(self) -> dict:
        """What this method did (JSON-able), once `adapt_model` has run."""
        ...


def write_description(method: TrainingMethod, out: Path) -> Path:
    """Rank 0: `method.describe()` to `OUT/method.json` (atomically), beside training_args.json."""
    path = Path(out) / DESCRIPTION_FILE
    atomic_write_text(path, json.dumps(method.describe(), indent=2) + "\n")
    return path


NO_DECAY_SUFFIXES = ("bias",)
"""Parameter names ending so get no weight decay (as transformers' Trainer does)."""


def is_no_decay(name: str, param: nn.Parameter, norm_param_names: set[str]) -> bool:
    """Biases and normalization weights are not decayed; every other weight is.

    Decaying a norm's gain pulls it towards 0 (towards switching the layer off), which is not the
    regularization weight decay stands for; transformers' Trainer excludes them the same way.
    """
    return name.endswith(NO_DECAY_SUFFIXES) or name in norm_param_names


def norm_parameter_names(model: nn.Module) -> set[str]:
    """Names of the parameters owned by normalization layers (LayerNorm, RMSNorm, ...)."""
    names = set()
    for module_name, module in model.named_modules():
        kind = type(module).__name__.lower()
        if isinstance(module, nn.LayerNorm) or "norm" in kind:
            for param_name, _ in module.named_parameters(recurse=False):
                names.add(f"{module_name}.{param_name}" if module_name else param_name)
    return names


def decay_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Trainable parameters in two optimizer groups: decayed, and not (biases, norms)."""
    norms = norm_parameter_names(model)
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if is_no_decay(name, param, norms) else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]
    return [group for group in groups if group["params"]]


class FullFineTuning:
    """Every parameter trains; no projection; weights export as they are."""

    name = "full"
    state_bytes_per_trainable = 0
    """Bytes the method keeps per trainable parameter element, sharded as the weights (EWC's
    Fisher and anchor: 8); what `mini-trainer plan` counts for it."""
    keeps_teacher = False
    """A second, frozen copy of the model sharded as the student (LwF's teacher); the plan
    counts its parameter shard."""

    def __init__(self, args=None):
        """`args`: the run's `TrainingArgs` (every method is built from them; unused here)."""

    def adapt_model(self, model: nn.Module, context: MethodContext | None = None) -> None:
        """Nothing to change: the model trains as loaded."""

    def convert_weights(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        return state

    def param_groups(self, model: nn.Module, weight_decay: float) -> list[dict]:
        return decay_param_groups(model, weight_decay)

    def micro_batch_loss(self, micro, attention_kwargs: dict):
        """The model's own loss."""
        return None

    def before_optimizer_step(self, model: nn.Module) -> None:
        """Gradients are used as they are."""

    def after_optimizer_step(self, model: nn.Module) -> None:
        """Parameters need no correction."""

    def export_weights(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        return state

    def step_metrics(self) -> dict[str, float]:
        """No figures of its own."""
        return {}

    def describe(self) -> dict:
        """What this method did, for the run's records (written beside training_args.json)."""
        return {"method": self.name}
