"""Load a Hugging Face safetensors checkpoint into FSDP2 shards, one tensor at a time.

Rank 0 alone reads the files, one tensor at a time in its stored dtype (read straight into a
fresh buffer, no memory map that would keep pages of the file resident), casts it to fp32,
converts the checkpoint's layout to the model's where they differ (`layouts.py`: per-expert
tensors into fused experts, transformers' own tables; gpt-oss's MXFP4 experts dequantized),
lets the method convert it (`convert_weights` accepts any subset of the state), and broadcasts
it; every rank copies its own slice into its shard. Rank 0 therefore never holds more than one
model tensor (and its checkpoint pieces) beyond its shard, whatever the model's size: no
`from_pretrained` of the whole model.

Keys must match the model's state-dict keys as Hugging Face saves them (`model.layers.0...`,
`lm_head.weight`); tied weights are loaded once; non-persistent buffers (rotary frequencies)
are not in checkpoints and are recomputed on every rank from the config.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from mini_trainer.distributed.runtime import Runtime, broadcast_object
from mini_trainer.errors import UserError
from mini_trainer.models.layouts import CheckpointLayout
from mini_trainer.models.safetensors_file import checkpoint_tensors, read_tensor

log = logging.getLogger("mini_trainer")

PREFIX = "model."
"""`CausalLMWithLoss` holds the Hugging Face model as `.model`: its keys carry this prefix."""


def load_targets(module: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(canonical name -> parameter or persistent buffer, every name -> canonical name).

    Tied weights (an LM head sharing the input embedding) are one parameter with two names: it
    is loaded once, from whichever name the checkpoint holds.
    """
    targets: dict[str, torch.Tensor] = {}
    alias: dict[str, str] = {}
    by_id: dict[int, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        canonical = by_id.setdefault(id(param), name)
        alias[name] = canonical
        targets.setdefault(canonical, param)
    persistent = set(module.state_dict(keep_vars=True))
    for name, buffer in module.named_buffers():
        if name in persistent:
            targets[name] = buffer
            alias[name] = name
    return targets, alias


IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq",)
"""Checkpoint tensors that older exports hold but the model recomputes; skipped quietly."""


@torch.no_grad()
def load_sharded_weights(
    module: nn.Module, model_path: str | Path, convert_weights, runtime: Runtime
) -> None:
    """Fill `module`'s (FSDP2-sharded, materialized) parameters from the checkpoint.

    `convert_weights` is the method's hook (dense fp32 subset -> adapted subset). Collective:
    every rank calls it; only rank 0 touches the files.
    """
    targets, alias = load_targets(module)
    loaded: set[str] = set()
    unknown: list[str] = []
    stream = None
    if runtime.is_main:
        stream = _rank0_stream(model_path, convert_weights, CheckpointLayout(module.model))
    while True:
        item = next(stream, None) if stream is not None else None
        header = broadcast_object(_header(item), runtime)
        if header is None:
            break
        if header[0] == "error":
            raise UserError(header[1])
        source, names = header[1], header[2]
        for index, (name, shape) in enumerate(names):
            canonical = alias.get(name)
            if canonical is None and not name.endswith(IGNORABLE_SUFFIXES):
                unknown.append(name)  # the config has no place for it: another model
            if canonical is None or canonical in loaded:
                continue
            target = targets[canonical]
            if tuple(target.shape) != tuple(shape):
                raise UserError(
                    f"{source}: {name.removeprefix(PREFIX)}: shape {list(shape)}, but the model "
                    f"expects {list(target.shape)}"
                )
            full = (
                item[1][index].to(runtime.device, target.dtype)
                if runtime.is_main
                else torch.empty(shape, dtype=target.dtype, device=runtime.device)
            )
            dist.broadcast(full, src=0)
            _copy_into(target, full)
            loaded.add(canonical)
            del full
    missing = sorted(set(targets) - loaded)
    if missing or unknown:
        # transformers only warns here; training would start from noise or another model.
        parts = [
            f"{len(names)} {what}: {_first_names(names)}"
            for what, names in (("weights missing from the checkpoint", missing),
                                ("checkpoint tensors not in the config", sorted(unknown)))
            if names
        ]  # fmt: skip
        raise UserError(f"{model_path}: the weights do not match config.json: {'; '.join(parts)}")
    init_non_persistent_buffers(module, runtime.device)


def _first_names(names: list[str], shown: int = 3) -> str:
    """The first few tensor names of a list, without the `model.` prefix, and how many more."""
    names = [name.removeprefix(PREFIX) for name in names]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _rank0_stream(model_path, convert_weights, layout: CheckpointLayout):
    """Rank 0: (file, [converted tensors], [(name, shape)]), one model tensor's group of
    checkpoint tensors at a time (one tensor, or every expert of one fused parameter)."""
    try:
        entries = checkpoint_tensors(model_path)
    except UserError as error:
        yield ("error", " ".join(error.lines))
        return
    for group in layout.groups(list(entries)):
        try:  # as stored: MXFP4 bytes are decoded by the layout, the rest cast after it
            read = {source: read_tensor(entries[source]) for source in group.sources}
        except UserError as error:
            yield ("error", " ".join(error.lines))
            return
        dense = {PREFIX + name: t.float() for name, t in layout.convert(group, read).items()}
        del read
        converted = convert_weights(dense)
        del dense
        names = [(key, tuple(value.shape)) for key, value in converted.items()]
        yield (str(entries[group.sources[0]].file), list(converted.values()), names)


def _header(item):
    """The part of a stream item every rank needs (no tensor data)."""
    if item is None:
        return None
    if item[0] == "error":
        return item
    return ("tensors", item[0], item[2])


def _copy_into(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's slice of the full tensor into `target` (a DTensor shard or a tensor)."""
    if isinstance(target, DTensor):
        local = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
        target.to_local().copy_(local.to_local())
    else:
        target.copy_(full)


def init_non_persistent_buffers(module: nn.Module, device) -> None:
    """Recompute buffers that checkpoints do not hold, on `device`: rotary frequencies, Gemma's
    embedding scale, whatever the family's own initializer (`_init_weights`) sets.

    They were built on the meta device, so they hold nothing after `to_empty`. Each is filled
    with NaN, then the initializer runs on its owner with the owner's parameters set aside
    (swapped for meta tensors, on which initialization is a no-op, so loaded weights are never
    re-initialized); a buffer the initializer did not set is refused rather than left as
    uninitialized memory.
    """
    hf_models = [m for m in module.modules() if hasattr(m, "_init_weights")]
    init = hf_models[0]._init_weights if hf_models else None
    for owner_name, owner in module.named_modules():
        names = [
            name
            for name, _ in owner.named_buffers(recurse=False)
            if name in owner._non_persistent_buffers_set
        ]
        if not names:
            continue
        for name in names:
            buffer = owner._buffers[name]
            owner._buffers[name] = torch.full(buffer.shape, float("nan"), dtype=buffer.dtype,
                                              device=device)  # fmt: skip
        params = owner._parameters
        owner._parameters = {
            key: None if value is None else nn.Parameter(torch.empty_like(value, device="meta"))
            for key, value in params.items()
        }
        try:
            if init is not None:
                init(owner)
        finally:
            owner._parameters = params
        unset = [name for name in names if not torch.isfinite(owner._buffers[name]).all()]
        if unset:
            raise UserError(
                f"{type(owner).__name__} ({owner_name}): non-persistent buffers {unset} cannot "
                "be recomputed (unsupported model)"
            )
