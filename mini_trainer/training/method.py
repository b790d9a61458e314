"""The seam between the training loop and a fine-tuning method.

The loop (`training/loop.py`) is the same for every method; what differs is a handful of hooks,
each called at one named point of a run. Plain full fine-tuning (`FullFineTuning`) implements
them as no-ops or plain defaults; OSFT implements them with its factorization and projections.
A method never branches the loop: the loop calls every hook on every run.

Order of the hooks in a run:
1. `adapt_model(model)`: on the meta-device model, before FSDP2 shards it (swap or add modules,
   freeze parameters).
2. `convert_weights(state)`: on rank 0, the dense checkpoint's fp32 tensors become the adapted
   model's state (e.g. dense W to factors); the result is broadcast into the shards.
3. `param_groups(model, weight_decay)`: what the optimizer trains, and with which decay.
4. per step: `before_optimizer_step(model)` once the gradients are summed over micro-batches
   and ranks, before the clip (so the clip and the logged norm see what the hook leaves), and
   `after_optimizer_step(model)` after `optimizer.step()`.
5. `export_weights(state)`: the adapted model's full state back to dense Hugging Face weights,
   for `hf_format/` and `final/`.
"""

from __future__ import annotations

from torch import Tensor, nn

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

    def adapt_model(self, model: nn.Module) -> None:
        """Nothing to change: the model trains as loaded."""

    def convert_weights(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        return state

    def param_groups(self, model: nn.Module, weight_decay: float) -> list[dict]:
        return decay_param_groups(model, weight_decay)

    def before_optimizer_step(self, model: nn.Module) -> None:
        """Gradients are used as they are."""

    def after_optimizer_step(self, model: nn.Module) -> None:
        """Parameters need no correction."""

    def export_weights(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        return state

    def describe(self) -> dict:
        """What this method did, for the run's records (written beside training_args.json)."""
        return {"method": self.name}


def make_method(args):
    """The method the arguments ask for: OSFT with --osft, full fine-tuning otherwise."""
    if args.osft:
        from mini_trainer.osft.method import OSFT

        return OSFT(args)
    return FullFineTuning()
