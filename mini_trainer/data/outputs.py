"""Guarding output paths before a long run starts, rather than failing (or clobbering) after it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mini_trainer.errors import UserError


def check_outputs(
    outputs: dict[str, str | os.PathLike], inputs: list[str | os.PathLike], force: bool
) -> None:
    """Refuse outputs that exist (unless `force`), coincide, or would replace an input.

    `outputs` maps an option name (for the message) to its path.
    """
    resolved_inputs = {Path(p).resolve() for p in inputs}
    seen: dict[Path, str] = {}
    for option, path in outputs.items():
        resolved = Path(path).resolve()
        if resolved in resolved_inputs:
            raise UserError(f"{path}: {option} would overwrite an input file")
        if resolved in seen:
            raise UserError(f"{path}: {option} and {seen[resolved]} are the same file")
        seen[resolved] = option
        if Path(path).is_dir():
            raise UserError(f"{path}: {option} is a folder, expected a file path")
        if Path(path).exists() and not force:
            raise UserError(f"{path}: already exists (pass --force to replace it)")
        check_writable(Path(path).parent, option)


def check_writable(folder: Path, option: str) -> None:
    """Create `folder` if needed and write a temporary file in it, or raise a `UserError`.

    Checked before any work, so a read-only or full location fails in a second, not after a
    long scan. (Permission bits alone say nothing for root: only a real write tells.)
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise UserError(f"{folder}: {option}: cannot write there ({error.strerror})") from None
