"""Atomic writes: outputs appear under their final name complete, or not at all."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _temp_sibling(path: Path, is_dir: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}.tmp-"
    if is_dir:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
    fd, name = tempfile.mkstemp(prefix=prefix, dir=path.parent)
    os.close(fd)
    return Path(name)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; rename it to `path` only if the block succeeds.

    On an exception the temporary file or folder is removed and `path` is left as it was.
    An existing folder at `path` is replaced (files are replaced atomically by `os.replace`).
    """
    final = Path(path)
    tmp = _temp_sibling(final, is_dir)
    try:
        yield tmp
        if is_dir:
            publish_dir(tmp, final)
        else:
            os.chmod(tmp, 0o644)
            os.replace(tmp, final)
    except BaseException:
        if is_dir:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def publish_dir(tmp: Path, final: Path) -> None:
    """Rename the complete folder `tmp` to `final`, replacing an older `final` if any.

    Files inside get the usual mode (0666 less the umask, 0644 by default): some writers
    (safetensors' `save_file`, hence `save_pretrained`) create them 0600 through a temporary
    file, which would make a shared checkpoint unreadable to the rest of a team.
    """
    os.chmod(tmp, 0o755)
    file_mode = 0o666 & ~current_umask()
    for path in tmp.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, file_mode)
    if not final.exists():
        os.replace(tmp, final)
        return
    old = _temp_sibling(final, is_dir=True)
    os.rmdir(old)
    os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


HASH_BLOCK = 1 << 20


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a whole file, read in 1 MiB blocks (the project's one full-file hash)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()
