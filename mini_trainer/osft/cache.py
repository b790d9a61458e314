"""The SVD cache written by `mini-trainer osft-svd` and read by `train --osft-svd-cache`.

Layout of DIR:
- `factors-<rank>-<part>.safetensors`: for every target module M, fp32 `M.U` (rows x r), `M.S`
  (r) and `M.V` (cols x r): the full thin SVD, so one cache serves any unfreeze ratio. A
  mixture of experts' fused weight M (E x rows x cols) has every expert's SVD, stacked
  (E x rows x r, E x r, E x cols x r); its weight is read in the model's layout
  (`models/layouts.py`: per-expert checkpoint tensors fused, MXFP4 dequantized) and hashed so.
- `meta.json`: format, source model, the content hash of the targeted weights, the patterns and
  targets with their shapes, every file's size and sha256, dtype, library versions.

A cache is used only when it matches: same content hash of the targeted weights (names, dtypes,
shapes and bytes; other weights may differ), same patterns, same shapes, and every file whole
(size and sha256 as recorded). Anything else is refused with one line naming the file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import Tensor

from mini_trainer.errors import UserError
from mini_trainer.io_utils import file_sha256
from mini_trainer.models.layouts import read_model_tensors
from mini_trainer.models.safetensors_file import (
    TensorEntry,
    checkpoint_tensors,
    read_tensors,
)

FORMAT = 1
META = "meta.json"


# ---------------------------------------------------------------------------- source weights


def _entries(model_dir: Path, names: list[str]) -> dict[str, TensorEntry]:
    entries = checkpoint_tensors(model_dir)
    missing = [name for name in names if name not in entries]
    if missing:
        raise UserError(f"{model_dir}: weight {missing[0]} not found in the safetensors files")
    return entries


def weight_key(name: str, shape: tuple[int, ...]) -> str:
    """A target's dense weight: `<module>.weight`, or a fused experts parameter's own name."""
    return name if len(shape) == 3 else f"{name}.weight"


def check_target_weights(model_dir: Path, targets: dict[str, tuple[int, ...]]) -> None:
    """Every linear target's weight is in the safetensors files with the shape the config gives
    it (headers only): a config that does not fit its weights is refused before any SVD, in
    the words the model loader uses for the same problem. Fused experts weights, stored in
    another layout, are checked when they are read."""
    linears = {module: shape for module, shape in targets.items() if len(shape) == 2}
    entries = _entries(model_dir, [f"{module}.weight" for module in linears])
    for module, shape in linears.items():
        entry = entries[f"{module}.weight"]
        if tuple(entry.shape) != tuple(shape):
            raise UserError(
                f"{entry.file}: {module}.weight: shape {list(entry.shape)}, but the model "
                f"expects {list(shape)}"
            )


def read_weights(model_dir: Path, names: list[str]) -> dict[str, Tensor]:
    """The named weights of `model_dir`, as stored (dtype included), or converted to the
    model's layout (fused experts)."""
    return read_model_tensors(model_dir, names)


def tensor_digest(name: str, tensor: Tensor) -> str:
    """sha256 of a weight's name, dtype, shape and bytes."""
    digest = hashlib.sha256(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    digest.update(memoryview(flat))
    return digest.hexdigest()


def combined_hash(digests: dict[str, str]) -> str:
    """One hash of the targeted weights, from their per-weight digests (any order given)."""
    total = hashlib.sha256()
    for name in sorted(digests):
        total.update(f"{name}={digests[name]}\n".encode())
    return total.hexdigest()


def source_hash(model_dir: Path, weight_names: list[str]) -> str:
    """The content hash of the targeted weights of `model_dir` (read one weight at a time)."""
    digests = {
        name: tensor_digest(name, read_weights(model_dir, [name])[name]) for name in weight_names
    }
    return combined_hash(digests)


CACHE_PACKAGES = ("mini-trainer", "torch", "transformers", "safetensors")
"""The libraries whose versions a cache's meta.json records (`versions.package_versions`)."""


# ---------------------------------------------------------------------------- reading


class SVDCache:
    """A checked cache folder: factors of one target at a time, for any frozen rank."""

    def __init__(self, folder: Path, meta: dict):
        self.folder = folder
        self.meta = meta

    @classmethod
    def open(
        cls, folder: Path, model_dir: Path, patterns: list[str] | None, shapes: dict[str, tuple]
    ) -> SVDCache:
        """Check `folder` against the model and targets of this run; refuse any mismatch.

        `shapes` maps each target module name to its weight's (rows, cols).
        """
        meta_path = folder / META
        meta = _read_meta(meta_path)
        if meta.get("patterns") != patterns:
            raise UserError(
                f"{meta_path}: patterns: the cache was built for {_patterns(meta.get('patterns'))}"
                f", this run targets {_patterns(patterns)} (rebuild it with osft-svd)"
            )
        targets = meta.get("targets", {})
        for name, shape in shapes.items():
            if name not in targets:
                raise UserError(f"{meta_path}: targets: no factors for {name} (rebuild the cache)")
            if tuple(targets[name]["shape"]) != tuple(shape):
                raise UserError(
                    f"{meta_path}: shape: {name} is {targets[name]['shape']} in the cache, "
                    f"{list(shape)} in {model_dir}"
                )
        extra = sorted(set(targets) - set(shapes))
        if extra:
            raise UserError(f"{meta_path}: targets: {extra[0]} is not a target of this model")
        expected = source_hash(model_dir, [weight_key(n, shape) for n, shape in shapes.items()])
        if meta.get("source_hash") != expected:
            raise UserError(
                f"{meta_path}: source_hash: the cache was built from other weights than "
                f"{model_dir}'s (rebuild it with osft-svd)"
            )
        for file, record in meta.get("files", {}).items():
            _check_file(folder / file, record)
        return cls(folder, meta)

    def factors(self, name: str) -> tuple[Tensor, Tensor, Tensor]:
        """(U, S, V) of target module `name`, fp32."""
        path = self.folder / self.meta["targets"][name]["file"]
        parts = read_tensors(path, [f"{name}.{part}" for part in "USV"])
        return tuple(parts.values())


def _patterns(patterns: list[str] | None) -> str:
    return "the default targets" if patterns is None else f"patterns {patterns}"


def _read_meta(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such file (not an osft-svd cache folder)") from None
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: unreadable ({error})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(f"{path}: format: not an osft-svd cache of format {FORMAT}")
    return meta


def _check_file(path: Path, record: dict) -> None:
    if not path.is_file():
        raise UserError(f"{path}: missing from the cache")
    size = path.stat().st_size
    if size != record["bytes"]:
        raise UserError(f"{path}: truncated or altered ({size} bytes, {record['bytes']} expected)")
    if file_sha256(path) != record["sha256"]:
        raise UserError(f"{path}: corrupt (sha256 differs from meta.json)")
