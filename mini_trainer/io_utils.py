"""Atomic writes: outputs appear under their final name complete, or not at all; file hashes.

The project's one way to publish a file or a folder (`atomic_path`, `atomic_write_text`,
`publish_file`, `publish_dir`, with `temp_sibling` for writers that share a temporary folder
across ranks) and to hash a file's bytes (`hash_file`, `file_sha256`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import xxhash


def temp_sibling(path: Path, is_dir: bool) -> Path:
    """A new, uniquely named temporary file or folder `.NAME.tmp-*` beside `path` (the same
    file system, so the rename that publishes it is atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}.tmp-"
    if is_dir:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
    fd, name = tempfile.mkstemp(prefix=prefix, dir=path.parent)
    os.close(fd)
    return Path(name)


@contextlib.contextmanager
def atomic_path(
    path: str | os.PathLike, is_dir: bool = False, fsync: bool = False
) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; rename it to `path` only if the block succeeds.

    On an exception the temporary file or folder is removed and `path` is left as it was.
    An existing folder at `path` is replaced (files are replaced atomically by `os.replace`).
    `fsync` (files only): the content is on disk before the rename, for files that a crash
    must find whole.
    """
    final = Path(path)
    tmp = temp_sibling(final, is_dir)
    try:
        yield tmp
        if is_dir:
            publish_dir(tmp, final)
        else:
            if fsync:
                with open(tmp, "rb") as handle:
                    os.fsync(handle.fileno())
            publish_file(tmp, final)
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


def publish_file(tmp: Path, final: Path) -> None:
    """Rename the complete file `tmp` to `final` (replacing it), readable by all (0644)."""
    os.chmod(tmp, 0o644)
    os.replace(tmp, final)


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
    old = temp_sibling(final, is_dir=True)
    os.rmdir(old)
    os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike, text: str, fsync: bool = False) -> None:
    """Write `text` to `path` through a temporary file and a rename (`fsync`: see
    `atomic_path`)."""
    with atomic_path(path, fsync=fsync) as tmp:
        tmp.write_text(text, encoding="utf-8")


HASH_BLOCK = 1 << 20


def hash_file(digest, path: str | os.PathLike, ranges: Iterable[tuple[int, int]] | None = None):
    """Feed `path`'s bytes into the hashlib object `digest` and return it: the whole file in
    1 MiB blocks, or only the `(offset, length)` ranges, in order (a range past the end gives
    what the file has). The one file reader of every file hash and fingerprint."""
    with open(path, "rb") as handle:
        if ranges is None:
            while block := handle.read(HASH_BLOCK):
                digest.update(block)
            return digest
        for offset, length in ranges:
            handle.seek(offset)
            digest.update(handle.read(length))
    return digest


FILE_DIGESTS = {"sha256": hashlib.sha256, "xxh3_64": xxhash.xxh3_64}
"""The digests `file_digest` knows: sha256 for content identity (caches, fingerprints), xxh3-64
for damage checks, where only speed matters (about 20 GB/s, 20 times sha256 here)."""


def file_digest(path: str | os.PathLike, algorithm: str) -> str:
    """The hex digest of a whole file with one of `FILE_DIGESTS`."""
    return hash_file(FILE_DIGESTS[algorithm](), path).hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a whole file (the project's full-file content hash)."""
    return file_digest(path, "sha256")
