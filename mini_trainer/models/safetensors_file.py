"""The one safetensors reader and weight-file locator: every reader of weights goes through it.

A safetensors file is 8 bytes of header length (little-endian u64), a JSON header (name ->
dtype, shape, data offsets) and the tensors' bytes. The length is checked against the file size
before anything is read or allocated: a git-lfs pointer (a clone without git-lfs), random bytes
or a truncated shard is one line naming the file, never a `MemoryError` or the safetensors
library's "header too large". Tensors are read by offset into a fresh buffer (no memory map).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from mini_trainer.errors import UserError

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024**2
"""The safetensors library's own limit on the JSON header."""
LFS_POINTER = b"version https://git-lfs.github.com/spec/"
READ_CHUNK = 1 << 28
"""Bytes per read() call (Linux returns at most ~2 GiB per call anyway)."""


@dataclass(frozen=True)
class TensorEntry:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    """Byte offset of the data in `file`."""
    end: int


def _refuse_lfs_pointer(path: Path, head: bytes) -> None:
    if head.startswith(LFS_POINTER):
        raise UserError(f"{path} is a git-lfs pointer, not weights: run git lfs pull")


def read_header(path: str | os.PathLike) -> dict[str, TensorEntry]:
    """The tensors of one safetensors file (name -> where and what), checked against its size.

    Raises a one-line `UserError` for anything that is not a whole safetensors file.
    """
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(8)
            _refuse_lfs_pointer(path, head + handle.read(len(LFS_POINTER) - len(head)))
            if len(head) < 8:
                raise UserError(f"{path}: not a safetensors file ({size} bytes, too short)")
            (length,) = struct.unpack("<Q", head)
            if length > size - 8 or length > MAX_HEADER_BYTES:
                raise UserError(
                    f"{path}: not a safetensors file (its header length {length} does not fit "
                    f"in its {size} bytes)"
                )
            handle.seek(8)
            raw = handle.read(length)
    except OSError as error:
        raise UserError(f"{path}: cannot read ({error.strerror})") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise UserError(f"{path}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise UserError(f"{path}: not a safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    data_start = 8 + length
    return {name: _entry(path, name, info, data_start, size) for name, info in header.items()}


def _entry(path: Path, name: str, info, data_start: int, size: int) -> TensorEntry:
    """One header entry, checked: known dtype, integer shape, offsets inside the file."""
    try:
        dtype_name, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        ints = [*shape, start, end]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
            raise ValueError
    except (TypeError, KeyError, ValueError):
        raise UserError(f"{path}: {name}: not a valid safetensors header entry") from None
    if dtype_name not in SAFETENSORS_DTYPES:
        raise UserError(f"{path}: {name}: unsupported dtype {dtype_name}")
    dtype = SAFETENSORS_DTYPES[dtype_name]
    expected = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if end - start != expected:
        raise UserError(
            f"{path}: {name}: data offsets [{start}, {end}] do not hold a {dtype_name} "
            f"tensor of shape {list(shape)}"
        )
    if data_start + end > size:
        raise UserError(
            f"{path}: truncated ({size} bytes, but tensor {name} ends at byte {data_start + end})"
        )
    return TensorEntry(path, dtype, tuple(shape), data_start + start, data_start + end)


def read_tensor(entry: TensorEntry) -> torch.Tensor:
    """One tensor in its stored dtype, read into a fresh buffer (no memory map)."""
    out = torch.empty(entry.shape, dtype=entry.dtype)
    buffer = memoryview(out.reshape(-1).view(torch.uint8).numpy()) if out.numel() else None
    with open(entry.file, "rb", buffering=0) as handle:
        handle.seek(entry.start)
        done, total = 0, entry.end - entry.start
        while done < total:
            got = handle.readinto(buffer[done : min(total, done + READ_CHUNK)])
            if not got:
                raise UserError(f"{entry.file}: truncated (file ends inside a tensor)")
            done += got
    return out


def read_tensors(path: str | os.PathLike, names: list[str]) -> dict[str, torch.Tensor]:
    """The named tensors of one safetensors file, as stored."""
    entries = read_header(path)
    missing = [name for name in names if name not in entries]
    if missing:
        raise UserError(f"{path}: no tensor {missing[0]}")
    return {name: read_tensor(entries[name]) for name in names}


# ---------------------------------------------------------------------------- the locator


def weight_file_names(folder: str | os.PathLike) -> list[str]:
    """The safetensors files of a model folder: the index's shards, or `model.safetensors`."""
    folder = Path(folder)
    index = folder / INDEX
    if index.is_file():
        return sorted(set(_weight_map(index).values()))
    if (folder / SINGLE).is_file():
        return [SINGLE]
    raise UserError(
        f"{folder}: no {SINGLE} or {INDEX} (only safetensors checkpoints are supported)"
    )


def _weight_map(index: Path) -> dict[str, str]:
    try:
        raw = index.read_bytes()
        _refuse_lfs_pointer(index, raw)
        weight_map = json.loads(raw)["weight_map"]
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()
        ):
            raise ValueError("weight_map is not a name -> file mapping")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{index}: not a readable safetensors index ({error})") from None
    return weight_map


def checkpoint_tensors(folder: str | os.PathLike) -> dict[str, TensorEntry]:
    """Every tensor of the model folder's weights (headers checked), in file and offset order.

    Reads headers only, so it doubles as the up-front check of a model's weight files.
    """
    folder = Path(folder)
    entries: dict[str, TensorEntry] = {}
    for name in weight_file_names(folder):
        entries.update(read_header(folder / name))
    return dict(sorted(entries.items(), key=lambda item: (str(item[1].file), item[1].start)))


def check_weight_files(folder: str | os.PathLike) -> None:
    """Refuse, in one line, a model folder whose weight files are not whole safetensors files."""
    checkpoint_tensors(folder)
