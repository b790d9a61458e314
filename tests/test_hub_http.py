"""One commit per job against a Hub over HTTP whose `main` moves while the job starts.

A local HTTP server answers the Hub's calls that huggingface_hub makes (a revision's commit
and file list, each file's metadata and bytes) for a repository of two commits of the demo
model, and can move `main` from one to the other. The Slurm launcher (`mini-trainer launch` in
a batch job, before srun starts one launcher per node) looks `main` up once; `main` then moves;
each node's launcher, with its own cache as on separate machines, downloads the pinned commit,
not the new `main`.

Why no two-node training run: what a node trains from is decided before its workers start (the
launcher's pin, then `pin_model_revision` on the node, which fetches exactly that commit), and
the workers' agreement on rank 0's commit is tested with two gloo ranks (test_hub.py). A
training run on top would show the same two calls again, for a minute of CPU.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import REPO_ROOT, base_flags, subprocess_env
from hf_cache import model_files

REPO_ID = "demo-org/moving"


class _Hub(http.server.ThreadingHTTPServer):
    """The repository's commits (commit -> {path: bytes}), its branches, the paths asked."""

    def __init__(self, commits: dict[str, dict[str, bytes]], main: str):
        super().__init__(("127.0.0.1", 0), _HubHandler)
        self.commits, self.refs, self.asked = commits, {"main": main}, []

    def commit(self, revision: str) -> str | None:
        revision = self.refs.get(revision, revision)
        return revision if revision in self.commits else None


def _oid(content: bytes) -> str:
    """A file's git blob id, as the Hub names a file kept in git (its ETag too)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class _HubHandler(http.server.BaseHTTPRequestHandler):
    server: _Hub

    def do_GET(self, body: bool = True):  # noqa: N802 (http.server's name)
        path = self.path.split("?")[0]
        self.server.asked.append(path)
        info = re.fullmatch(rf"/api/models/{REPO_ID}/revision/([^/]+)", path)
        tree = re.fullmatch(rf"/api/models/{REPO_ID}/tree/([^/]+)/?", path)
        resolve = re.fullmatch(rf"/{REPO_ID}/resolve/([^/]+)/(.+)", path)
        found = info or tree or resolve
        commit = self.server.commit(found.group(1)) if found else None
        if commit is None:
            return self._send(404, b"{}", {"X-Error-Code": "RevisionNotFound"}, body)
        files = self.server.commits[commit]
        if info:
            data = {"id": REPO_ID, "modelId": REPO_ID, "sha": commit, "private": False,
                    "siblings": [{"rfilename": name} for name in sorted(files)]}  # fmt: skip
            return self._send(200, json.dumps(data).encode(), {}, body)
        if tree:
            entries = [{"type": "file", "path": name, "size": len(content), "oid": _oid(content)}
                       for name, content in sorted(files.items())]  # fmt: skip
            return self._send(200, json.dumps(entries).encode(), {}, body)
        content = files.get(resolve.group(2))
        if content is None:
            return self._send(404, b"{}", {"X-Error-Code": "EntryNotFound"}, body)
        self._send(200, content, {"X-Repo-Commit": commit, "ETag": f'"{_oid(content)}"'}, body)

    def do_HEAD(self):  # noqa: N802
        self.do_GET(body=False)

    def _send(self, status: int, content: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(content))}.items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(content)

    def log_message(self, *args):
        pass


@pytest.fixture
def moving_hub(demo_model):
    """The HTTP Hub: commit 'a' * 40 is `main`, commit 'b' * 40 (another README) is not yet."""
    first, second = "a" * 40, "b" * 40
    files = model_files(demo_model)
    hub = _Hub({first: files, second: {**files, "README.md": b"main moved\n"}}, main=first)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    yield hub
    hub.shutdown()


def hub_env(hub: _Hub, home: Path, **extra: str) -> dict[str, str]:
    """A child's environment: the HTTP Hub, its own empty cache (a machine of its own)."""
    env = subprocess_env(HF_ENDPOINT=f"http://127.0.0.1:{hub.server_port}", HF_HOME=str(home),
                         HF_HUB_DISABLE_IMPLICIT_TOKEN="1")  # fmt: skip
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE"):
        env.pop(name, None)
    return {k: v for k, v in env.items() if not k.startswith("SLURM_")} | extra


NODE = """
import json, sys
from mini_trainer.train import parse_training_args, pin_model_revision
flags = json.loads(sys.argv[1])
print(pin_model_revision(parse_training_args(flags), flags)[-1])
"""
"""What a node's launcher does before its workers start (train.launch): fetch the commit the
flags name and pin it; prints that commit (the last flag it hands its workers)."""


def test_a_branch_that_moves_between_the_nodes_starts_splits_no_job(moving_hub, demo_dir, tmp_path):
    first, second = "a" * 40, "b" * 40
    flags = [str(f) for f in base_flags(demo_dir, tmp_path / "run",
                                        **{"model-name-or-path": REPO_ID})]  # fmt: skip
    # The batch job's launcher: one Hub call decides main's commit before srun starts the nodes.
    slurm = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]"}
    launcher = subprocess.run(
        [sys.executable, "-m", "mini_trainer", "launch", "--nproc-per-node", "1", "--dry-run",
         "--", *flags],
        capture_output=True, text=True, env=hub_env(moving_hub, tmp_path / "login", **slurm),
        cwd=REPO_ROOT, timeout=120,
    )  # fmt: skip
    assert launcher.returncode == 0, launcher.stderr
    node_flags = launcher.stdout.split(" -- ", 1)[1].split()
    assert node_flags[-2:] == ["--model-revision", first]

    def node(name: str, node_flags: list[str]) -> str:
        result = subprocess.run(
            [sys.executable, "-c", NODE, json.dumps(node_flags)], capture_output=True, text=True,
            env=hub_env(moving_hub, tmp_path / name), cwd=REPO_ROOT, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout.strip()

    assert node("node1", node_flags) == first
    moving_hub.refs["main"] = second  # main moves between the two nodes' starts
    moving_hub.asked.clear()
    assert node("node2", node_flags) == first  # node 2 trains from the same commit ...
    snapshots = tmp_path / "node2" / "hub" / "models--demo-org--moving" / "snapshots"
    assert [p.name for p in snapshots.iterdir()] == [first]
    assert not [path for path in moving_hub.asked if second in path or "/main" in path]
    # ... where the flags as given (no pin) would have trained node 2 from the new main.
    assert node("node3", flags) == second
