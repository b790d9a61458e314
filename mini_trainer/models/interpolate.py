"""Weight interpolation (WiSE-FT style): `theta = (1 - alpha) * previous + alpha * new`.

After a stage, the folder of its weights (`new`) and of the weights it started from
(`previous`) give, for each alpha, a model between the two: alpha 0 is `previous`, alpha 1 is
`new`, each a point on the forgetting/learning frontier with no training. Every tensor is
blended in fp32 and stored in `new`'s dtype, in `new`'s file layout; alpha 0 and 1 copy the
stored tensors as they are (bit for bit). The other files of `new` (config, tokenizer, chat
template) are copied. The folder appears complete or not at all.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_path
from mini_trainer.models.safetensors_file import checkpoint_tensors, read_tensor

RECORD = "interpolation.json"
"""What the folder is: previous, new, alpha (written beside the weights)."""


def blend(previous: torch.Tensor, new: torch.Tensor, alpha: float) -> torch.Tensor:
    """`(1 - alpha) * previous + alpha * new` in fp32, in `new`'s dtype; the ends exact."""
    if alpha == 1.0:
        return new.clone()
    if alpha == 0.0:
        return previous.to(new.dtype)
    mixed = (1.0 - alpha) * previous.float() + alpha * new.float()
    return mixed.to(new.dtype)


def interpolate(previous: Path, new: Path, alpha: float, out: Path) -> dict:
    """Write the blend of the folders `previous` and `new` at `alpha` to `out`; its record."""
    if not (math.isfinite(alpha) and 0.0 <= alpha <= 1.0):
        raise UserError(f"--alpha: must be in [0, 1], got {alpha}")
    old_entries, new_entries = checkpoint_tensors(previous), checkpoint_tensors(new)
    differ = sorted(set(old_entries) ^ set(new_entries))
    if differ:
        raise UserError(f"{previous} and {new}: not the same tensors (e.g. {differ[0]})")
    for name, entry in new_entries.items():
        if old_entries[name].shape != entry.shape:
            raise UserError(
                f"{name}: shape {list(old_entries[name].shape)} in {previous}, "
                f"{list(entry.shape)} in {new}"
            )
    by_file: dict[str, list[str]] = {}
    for name, entry in new_entries.items():
        by_file.setdefault(entry.file.name, []).append(name)
    record = {"previous": str(previous), "new": str(new), "alpha": alpha}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out, is_dir=True) as tmp:  # made empty; renamed to `out` when complete
        for path in Path(new).iterdir():
            if path.is_file() and not path.name.endswith(".safetensors"):
                shutil.copy2(path, tmp / path.name)
        for file_name, names in by_file.items():
            tensors = {
                name: blend(read_tensor(old_entries[name]), read_tensor(new_entries[name]), alpha)
                for name in names
            }
            save_file(tensors, tmp / file_name, metadata={"format": "pt"})
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record
