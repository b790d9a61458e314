"""Write a Hugging Face safetensors folder from FSDP2 shards, one module at a time.

Every rank takes part in gathering one module's parameters at a time (`full_tensor()`); rank 0
hands them to the method's `export_weights` (any subset of the state, here one module's tensors,
so factors of one target are exported together), casts them to the save dtype and writes each
tensor straight to its place in its shard file, in the checkpoint's own key layout (fused
experts written back one tensor per expert: `layouts.py`). The files' layouts are computed
first, from the shapes alone (a dry run of `export_weights` on the meta device), so nothing
waits in memory for a shard to fill: rank 0 holds one module's tensors at a time, never the
whole model.

The files are byte for byte what `safetensors.torch.save_file` writes for the same tensors
(tensors sorted by name, the JSON header padded with spaces to 8 bytes), and shards follow
huggingface_hub's naming (`model-00001-of-00003.safetensors` plus an index) above
`max_shard_bytes`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from mini_trainer.distributed.runtime import Runtime
from mini_trainer.models.layouts import CheckpointLayout
from mini_trainer.models.loading import PREFIX
from mini_trainer.models.safetensors_file import SAFETENSORS_DTYPES

WRITE_BLOCK = 1 << 24
"""Elements cast and written per write() call (64 MB of fp32)."""
DTYPE_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
ToDense = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


def module_groups(model: nn.Module) -> list[list[str]]:
    """The state-dict keys (parameters and persistent buffers, tied names included) grouped by
    owning module, in state-dict order: the unit that is gathered and exported at once."""
    groups: dict[str, list[str]] = {}
    for key in model.state_dict(keep_vars=True):
        groups.setdefault(key.rpartition(".")[0], []).append(key)
    return list(groups.values())


def gather_to_rank0(tensor: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """The whole tensor on rank 0 of the mesh, None elsewhere (collective for a DTensor).

    FSDP2's dim-0 shards (torch.chunk rows: the last ranks' maybe short or empty) are sent to
    rank 0, which receives each straight into its rows of one buffer: no other rank ever holds
    the full tensor, and rank 0 holds it once (a `gather` would stage a second copy on gloo).
    Other layouts fall back to `full_tensor()`.
    """
    if not isinstance(tensor, DTensor):
        return tensor.detach()
    mesh, local = tensor.device_mesh, tensor.to_local().detach().to(device)
    world, rank = mesh.size(), mesh.get_local_rank()
    rows = tensor.shape[0] if tensor.dim() else 0
    chunk = -(-rows // world) if rows else 0
    spans = [(min(r * chunk, rows), min((r + 1) * chunk, rows)) for r in range(world)]
    simple = mesh.ndim == 1 and tuple(tensor.placements) == (Shard(0),) and tensor.dim() > 0
    if not simple or local.shape[0] != spans[rank][1] - spans[rank][0]:
        full = DTensor.from_local(
            local, mesh, tensor.placements, shape=tensor.shape, stride=tensor.stride()
        ).full_tensor()
        return full if rank == 0 else None
    group = mesh.get_group()
    if rank != 0:
        if local.shape[0]:
            dist.send(local.contiguous(), dst=dist.get_global_rank(group, 0), group=group)
        return None
    out = torch.empty(tuple(tensor.shape), dtype=local.dtype, device=device)
    out[spans[0][0] : spans[0][1]] = local
    for source in range(1, world):
        start, end = spans[source]
        if end > start:
            dist.recv(out[start:end], src=dist.get_global_rank(group, source), group=group)
    return out


def hf_name(key: str) -> str:
    return key.removeprefix(PREFIX)


@dataclass
class ShardLayout:
    """One safetensors file: its tensors, where each goes, and the header that says so."""

    filename: str
    specs: dict[str, tuple[torch.dtype, tuple[int, ...]]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(dtype, shape) for dtype, shape in self.specs.values())

    def header(self, metadata: dict[str, str]) -> tuple[bytes, dict[str, int]]:
        """(the file's first bytes: length + JSON, data offset of each tensor), as save_file."""
        entries: dict[str, object] = {"__metadata__": metadata}
        offsets, position = {}, 0
        for name in sorted(self.specs):  # one dtype per export: save_file's order is by name
            dtype, shape = self.specs[name]
            size = _nbytes(dtype, shape)
            entries[name] = {
                "dtype": DTYPE_NAMES[dtype],
                "shape": list(shape),
                "data_offsets": [position, position + size],
            }
            offsets[name] = position
            position += size
        text = json.dumps(entries, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text, offsets


def plan_shards(
    specs: dict[str, tuple[torch.dtype, tuple[int, ...]]], max_shard_bytes: int
) -> list[ShardLayout]:
    """Split tensors, in order, into files of at most `max_shard_bytes` (huggingface_hub's rule:
    a new file when the next tensor would not fit; a tensor larger than that alone)."""
    shards: list[ShardLayout] = [ShardLayout("")]
    for name, (dtype, shape) in specs.items():
        size = _nbytes(dtype, shape)
        if shards[-1].specs and shards[-1].nbytes + size > max_shard_bytes:
            shards.append(ShardLayout(""))
        shards[-1].specs[name] = (dtype, shape)
    count = len(shards)
    for number, shard in enumerate(shards, start=1):
        suffix = f"-{number:05d}-of-{count:05d}" if count > 1 else ""
        shard.filename = f"model{suffix}.safetensors"
    return shards


class ShardedWriter:
    """Rank 0's files: each tensor written at its planned offset as soon as it exists."""

    def __init__(self, out: Path, shards: list[ShardLayout], metadata: dict[str, str]):
        self.out = out
        self.where: dict[str, tuple[ShardLayout, int]] = {}
        self.handles = {}
        self.pending = {}
        for shard in shards:
            header, offsets = shard.header(metadata)
            handle = open(out / shard.filename, "wb")  # noqa: SIM115 (closed in close())
            handle.write(header)
            handle.truncate(len(header) + shard.nbytes)
            self.handles[shard.filename] = (handle, len(header))
            self.pending[shard.filename] = set(shard.specs)
            for name, offset in offsets.items():
                self.where[name] = (shard, offset)
        self.shards = shards

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Write `tensor` cast to the planned dtype, a block of rows at a time (no full copy)."""
        shard, offset = self.where[name]
        dtype, shape = shard.specs[name]
        if tuple(tensor.shape) != shape:
            raise RuntimeError(
                f"export: {name} came out with shape {list(tensor.shape)}, planned {list(shape)}"
            )
        handle, data_start = self.handles[shard.filename]
        handle.seek(data_start + offset)
        flat = tensor.reshape(-1) if tensor.is_contiguous() else tensor.contiguous().reshape(-1)
        for start in range(0, flat.numel(), WRITE_BLOCK):
            block = flat[start : start + WRITE_BLOCK].to(dtype)
            handle.write(memoryview(block.view(torch.uint8).numpy()))
        self.pending[shard.filename].discard(name)
        if not self.pending[shard.filename]:  # the file is complete: release it now
            handle.close()

    def close(self) -> None:
        unwritten = sorted(name for names in self.pending.values() for name in names)
        for handle, _ in self.handles.values():
            handle.close()
        if unwritten:
            raise RuntimeError(f"export: never written: {unwritten[:3]}")
        if len(self.shards) > 1:
            index = {
                "metadata": {"total_size": sum(shard.nbytes for shard in self.shards)},
                "weight_map": {name: self.where[name][0].filename for name in self.where},
            }
            (self.out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def export_hf_weights(
    model: nn.Module,
    out: Path | None,
    dtype: torch.dtype,
    runtime: Runtime,
    to_dense: ToDense,
    tied_embeddings: bool,
    max_shard_bytes: int,
) -> None:
    """Write `model`'s dense weights as safetensors under `out` (rank 0; `out` None elsewhere).

    Collective: every rank calls it, in the same order of modules.
    """
    skip = {"lm_head.weight"} if tied_embeddings else set()  # the embedding, under another name
    groups = [[key for key in keys if hf_name(key) not in skip] for keys in module_groups(model)]
    groups = [keys for keys in groups if keys]
    state = model.state_dict(keep_vars=True)
    writer = None
    if runtime.is_main:
        layout = CheckpointLayout(model.model)
        specs = {}
        for keys in groups:
            meta = {key: torch.empty(state[key].shape, device="meta") for key in keys}
            for name, tensor in _on_disk(to_dense(meta), tied_embeddings, layout).items():
                specs[name] = (dtype, tuple(tensor.shape))
        writer = ShardedWriter(out, plan_shards(specs, max_shard_bytes), {"format": "pt"})
    for keys in groups:
        gathered = {key: gather_to_rank0(state[key], runtime.device) for key in keys}
        if writer is not None:
            fp32 = {key: value.to("cpu", torch.float32) for key, value in gathered.items()}
            del gathered
            for name, tensor in _on_disk(to_dense(fp32), tied_embeddings, layout).items():
                writer.write(name, tensor)
            del fp32
        else:
            del gathered
    if writer is not None:
        writer.close()


def _on_disk(
    state: dict[str, torch.Tensor], tied_embeddings: bool, layout: CheckpointLayout
) -> dict[str, torch.Tensor]:
    """One module's dense tensors under their checkpoint names, in the checkpoint's layout
    (fused experts written back one tensor per expert, as `save_pretrained` does)."""
    named = {
        hf_name(key): tensor
        for key, tensor in state.items()
        if not (tied_embeddings and hf_name(key) == "lm_head.weight")  # saved as the embedding
    }
    return layout.to_checkpoint(named)


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count * torch.empty((), dtype=dtype).element_size()
