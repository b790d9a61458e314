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


def check_writable(folder: str | os.PathLike, option: str) -> None:
    """Raise a one-line `UserError` unless files can be written in `folder`.

    The one check every subcommand makes on its output location before any work, so a read-only
    or full location fails in a second, not after a long scan or SVD. A folder that does not
    exist yet is not created: its nearest existing ancestor must take a file. (Permission bits
    alone say nothing for root: only a real write tells.)
    """
    folder = Path(folder)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{folder}: {option}: cannot write there ({existing} is not a folder)")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise UserError(f"{folder}: {option}: cannot write there ({error.strerror})") from None
