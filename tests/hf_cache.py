"""A real Hugging Face cache folder built from a local model, for offline Hub-id tests.

The layout is the one huggingface_hub writes: `HF_HOME/hub/models--ORG--NAME/` with
`blobs/<sha>` (the sha256 of an LFS file such as a safetensors shard, the git blob sha1 of any
other file), `snapshots/<COMMIT>/<file>` as relative links into `blobs/`, `refs/<branch>`
holding the commit (no newline), and `trees/<COMMIT>.json`, the cached tree listing that
huggingface_hub >= 2.4 checks a snapshot against offline.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")


@dataclass
class HubRepo:
    hf_home: Path
    repo_id: str

    @property
    def folder(self) -> Path:
        return self.hf_home / "hub" / ("models--" + self.repo_id.replace("/", "--"))

    def env(self, **extra: str) -> dict[str, str]:
        """Environment variables for an offline run against this cache."""
        return {"HF_HOME": str(self.hf_home), "HF_HUB_OFFLINE": "1", **extra}

    def add_snapshot(self, files: dict[str, bytes], ref: str | None = "main") -> str:
        """Store `files` as one commit (links into blobs, tree listing); point `ref` at it."""
        commit = hashlib.sha1(
            b"".join(
                name.encode() + hashlib.sha256(data).digest()
                for name, data in sorted(files.items())
            )
        ).hexdigest()
        snapshot = self.folder / "snapshots" / commit
        listing = {}
        for name, data in files.items():
            lfs = name.endswith(LFS_SUFFIXES)
            blob_id = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            blob = hashlib.sha256(data).hexdigest() if lfs else blob_id
            (self.folder / "blobs").mkdir(parents=True, exist_ok=True)
            (self.folder / "blobs" / blob).write_bytes(data)
            link = snapshot / name
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(os.path.relpath(self.folder / "blobs" / blob, link.parent))
            entry = {"size": len(data), "blob_id": blob_id}
            if lfs:
                entry.update(lfs_sha256=blob, lfs_size=len(data))
            listing[name] = entry
        trees = self.folder / "trees"
        trees.mkdir(parents=True, exist_ok=True)
        (trees / f"{commit}.json").write_text(json.dumps({"format_version": 1, "files": listing}))
        if ref is not None:
            self.set_ref(ref, commit)
        return commit

    def set_ref(self, ref: str, commit: str) -> None:
        (self.folder / "refs").mkdir(parents=True, exist_ok=True)
        (self.folder / "refs" / ref).write_text(commit)


def model_files(model_dir: Path) -> dict[str, bytes]:
    """Every file of a local model folder, by name."""
    return {path.name: path.read_bytes() for path in sorted(model_dir.iterdir()) if path.is_file()}


def build_hub_cache(
    model_dir: Path, hf_home: Path, repo_id: str = "demo-org/tiny-llama"
) -> HubRepo:
    """A cache holding `model_dir` as `repo_id`, its `main` at one commit."""
    repo = HubRepo(Path(hf_home), repo_id)
    repo.add_snapshot(model_files(model_dir))
    return repo
