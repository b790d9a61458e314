"""Provenance helpers: package versions, the git commit, the machine. No torch import.

`importlib.metadata` reads versions from the installed distributions' metadata, so asking for
torch's version does not import torch: the report package relies on that.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path

PACKAGES = (
    "mini-trainer", "torch", "transformers", "tokenizers", "safetensors", "numpy", "numba",
    "snakemake", "lm_eval", "matplotlib",
)  # fmt: skip


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """`{name: version}` of each installed package; None for one that is not installed."""
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(path: str | os.PathLike = ".") -> str | None:
    """The commit checked out at `path` (with `-dirty` if the tree has changes), or None."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}-dirty" if dirty else commit or None


def machine() -> dict:
    """Host name, OS, Python and CPU count: enough to tell where a number was measured."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }


def source_commit() -> str | None:
    """The git commit of the mini_trainer source tree, if it is a checkout."""
    return git_commit(Path(__file__).resolve().parent)
