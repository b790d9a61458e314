"""The training model on the meta device, and what its parameters cost per rank.

`build` makes the model exactly as `training/model_setup.build_model` does before it allocates
anything (`meta_model`: the method adapts it, activation checkpointing is set), and `count`
walks the FSDP2 units that `fsdp_units` names, sharding each parameter the way `fully_shard`
does (dim 0 split over the ranks, padded to equal rows), with the dtypes of `shard_policy`
and the optimizer groups of `method.param_groups`. Nothing is allocated: a 70B model costs
a second or two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from mini_trainer.errors import UserError
from mini_trainer.method import FullFineTuning, MethodContext
from mini_trainer.models.moe import active_fraction, expert_parameters
from mini_trainer.osft.method import OSFT
from mini_trainer.osft.targets import layer_index
from mini_trainer.training.loss import chunked_linear_cross_entropy
from mini_trainer.training.method import method_class
from mini_trainer.training.model_setup import decoder_layers, fsdp_units, meta_model

OSFT_FROZEN_PARTS = ("W_high", "U_high", "V_high", "U_low_init", "V_low_init")


@dataclass
class Unit:
    """One FSDP2 unit: what one all-gather brings in and one reduce-scatter sends out."""

    name: str
    params: int
    """Elements of all its parameters (unsharded)."""
    trainable: int
    """Elements that get gradients."""
    shard_trainable: int = 0
    """This rank's elements of those."""


@dataclass
class Counts:
    """Per-rank element counts (fp32 master weights) and the unit layout."""

    total_params: int
    trainable_params: int
    shard_params: int
    """This rank's elements of every parameter (dim-0 padding included)."""
    shard_trainable: int
    shard_osft_frozen: int
    """Of shard_params: OSFT's W_high and frozen bases."""
    shard_osft_trainable: int
    """Of shard_params: OSFT's low factors."""
    units: list[Unit] = field(default_factory=list)
    decay_groups: dict[str, int] = field(default_factory=dict)
    """Optimizer group name -> trainable elements in it (global)."""
    largest_param: int = 0
    osft_targets: int = 0
    osft_svd_elements: int = 0
    """fp32 elements of the full thin SVDs of every target (the osft-svd cache)."""
    dense_params: int = 0
    """Elements of the exported Hugging Face weights (OSFT targets as dense again)."""
    method_state_bytes: int = 0
    """This rank's bytes of the method's own sharded state (EWC: Fisher and anchor, fp32)."""
    teacher_shard_params: int = 0
    """This rank's elements of a frozen teacher's parameters (LwF; 0 without one)."""
    expert_params: int = 0
    """Of total_params: the routed experts' (a mixture of experts; 0 for a dense model)."""
    active_params: int = 0
    """The parameters one token uses: all but the routed experts, and top_k / experts of
    those (every expert is still trained, sharded and stored)."""

    @property
    def layer_units(self) -> list[Unit]:
        return self.units[:-1]

    @property
    def root(self) -> Unit:
        return self.units[-1]


class PlannedOSFT(OSFT):
    """The real OSFT method, minus what needs the weights or writes files.

    Adaptive ranks are measured on the data at run time; the plan takes every layer at the
    lowest frozen fraction (`--osft-min-frozen-ratio`), the most that can train: an upper bound.
    """

    def _layer_fractions(self, names, context):
        if self.args.osft_rank_mode == "uniform":
            return super()._layer_fractions(names, context)
        fraction = self.args.osft_min_frozen_ratio
        return {i: {"frozen_fraction": fraction} for i in {layer_index(n) for n in names}}

    def _open_cache(self, shapes):
        return None  # the plan needs the ranks, not the factors

    def _record(self, out):
        pass  # a plan writes nothing


def build(config, args):
    """(wrapped meta model, method): the model `build_model` would shard, without memory."""
    if args.osft:
        method = PlannedOSFT(args)
    else:  # the method's own class says what it keeps; its hooks need no files here
        method = FullFineTuning(args)
        chosen = method_class(args.method)
        method.state_bytes_per_trainable = chosen.state_bytes_per_trainable
        method.keeps_teacher = chosen.keeps_teacher
    context = MethodContext(None, Path(args.output_dir or "."), None)  # a fresh start
    try:
        wrapped = meta_model(
            config, chunked_linear_cross_entropy, method, context,
            activation_checkpointing=args.activation_checkpointing,
        )  # fmt: skip
    except (ValueError, KeyError, AttributeError, TypeError) as error:
        raise UserError(f"{args.model_name_or_path}: cannot build this model ({error})") from None
    decoder_layers(wrapped.model)  # an UserError for a model without decoder layers
    return wrapped, method


def shard_elements(param: torch.Tensor, world: int) -> int:
    """Elements of rank 0's shard: `fully_shard` splits dim 0 into `world` equal padded chunks."""
    if param.dim() == 0:
        return 1
    rows = math.ceil(param.shape[0] / world)
    return rows * (param.numel() // max(param.shape[0], 1))


def count(wrapped: nn.Module, method, world: int, weight_decay: float) -> Counts:
    """Counts of parameters, shards, units and optimizer groups of the meta model."""
    units_modules = fsdp_units(wrapped)
    owner: dict[int, int] = {}
    for index, module in enumerate(units_modules):  # inner units claim their parameters first
        for param in module.parameters():
            owner.setdefault(id(param), index)
    units = [Unit(_unit_name(i, len(units_modules)), 0, 0) for i in range(len(units_modules))]
    counts = Counts(0, 0, 0, 0, 0, 0, units=units)
    seen: set[int] = set()
    for name, param in wrapped.named_parameters(remove_duplicate=True):
        if id(param) in seen:
            continue
        seen.add(id(param))
        numel, shard = param.numel(), shard_elements(param, world)
        unit = units[owner[id(param)]]
        unit.params += numel
        counts.total_params += numel
        counts.shard_params += shard
        counts.largest_param = max(counts.largest_param, numel)
        part = name.rsplit(".", 1)[-1]
        if part in OSFT_FROZEN_PARTS:
            counts.shard_osft_frozen += shard
        elif part in ("U_low", "S_low", "V_low"):
            counts.shard_osft_trainable += shard
        if param.requires_grad:
            unit.trainable += numel
            unit.shard_trainable += shard
            counts.trainable_params += numel
            counts.shard_trainable += shard
    for group in method.param_groups(wrapped, weight_decay):
        counts.decay_groups[group["name"]] = sum(p.numel() for p in group["params"])
    targets = getattr(method, "targets", {})
    counts.osft_targets = len(targets)
    counts.osft_svd_elements = sum(
        max(1, t.experts) * t.rank * (t.rows + t.cols + 1) for t in targets.values()
    )
    counts.dense_params = (
        counts.total_params
        - sum(
            p.numel()
            for n, p in wrapped.named_parameters()
            if n.rsplit(".", 1)[-1] in (*OSFT_FROZEN_PARTS, "U_low", "S_low", "V_low")
        )
        + sum(max(1, t.experts) * t.rows * t.cols for t in targets.values() if t.factorized)
    )
    counts.method_state_bytes = counts.shard_trainable * method.state_bytes_per_trainable
    counts.teacher_shard_params = counts.shard_params if method.keeps_teacher else 0
    counts.expert_params = expert_parameters(wrapped)
    fraction = active_fraction(wrapped.model)
    counts.active_params = counts.total_params - round(counts.expert_params * (1 - fraction))
    return counts


def _unit_name(index: int, total: int) -> str:
    return "root (embeddings, final norm, LM head)" if index == total - 1 else f"layer {index}"
