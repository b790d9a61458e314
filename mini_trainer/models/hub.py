"""Resolve a model argument: a local folder, or a Hugging Face Hub id `ORG/NAME` at a revision.

An existing local folder always wins. Otherwise `ORG/NAME` is fetched into the Hugging Face
cache with `huggingface_hub.snapshot_download` (only what training needs: config, tokenizer,
generation config, `*.safetensors` and their index; never pickled weights nor `original/`), and
the answer is the cache's snapshot folder `.../models--ORG--NAME/snapshots/<COMMIT>/`. Because
that path names the repository and the commit, anything given the folder can record both
(`hub_source`): training args, exported folders, evaluation JSONs, the resume fingerprint.

`HF_HOME`, `HF_HUB_CACHE`, `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`), `HF_ENDPOINT` and
`HF_TOKEN` mean what they mean to transformers; they are read at call time. Every failure is a
`UserError` of one line (exit status 2). A snapshot is checked complete (config plus every file
of the safetensors index) before it is used: an interrupted download is never taken for a model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mini_trainer.distributed.env import env_world
from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_write_text

HUB_ID = re.compile(
    r"^(?!.*(--|\.\.))[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
)
"""`ORG/NAME` as the Hub allows it (no `--` or `..`, at most 96 characters per part)."""
COMMIT = re.compile(r"^[0-9a-f]{40}$")
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken"]
"""Config, generation config, tokenizer files, chat template, safetensors weights and index."""
IGNORE_PATTERNS = ["*/*", "*.bin", "*.pth", "*.pt", "*.ckpt", "*.pkl", "*.msgpack", "*.h5"]
"""Subfolders (`original/`, `onnx/`...) and pickled or other-framework weights: never fetched."""
WEIGHTS_PATTERNS = ["*.safetensors", "model.safetensors.index.json"]
FETCH_HINT = "mini-trainer resolve-model --model {id} --model-revision {rev}"
"""The command that fills the cache (on a host with network access)."""


@dataclass(frozen=True)
class ResolvedModel:
    folder: Path
    """The local folder to read: the argument itself, or the cache's snapshot folder."""
    commit: str | None
    """The Hub commit (40 hex digits); None for a local folder."""
    hub_id: str | None = None
    revision: str | None = None
    """The revision asked for (`main`, a tag, a commit); None for a local folder."""

    def record(self) -> dict:
        """What JSON records keep of the model: folder, and the Hub id and commit if any."""
        return {"folder": str(self.folder), "hub_id": self.hub_id, "revision": self.revision,
                "commit": self.commit}  # fmt: skip


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache as huggingface_hub computes it, from the environment now."""
    if cache := os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.path.expandvars(cache)).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value, as huggingface_hub reads it."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in ("1", "ON", "YES", "TRUE")


def repo_folder(hub_id: str, cache: Path | None = None) -> Path:
    """`models--ORG--NAME` under the cache: where huggingface_hub keeps this repository."""
    return (cache or hub_cache_dir()) / ("models--" + hub_id.replace("/", "--"))


def hub_source(folder: str | os.PathLike) -> dict | None:
    """{"hub_id", "commit"} when `folder` is a cache snapshot folder, else None (no I/O)."""
    path = Path(folder)
    repo = path.parent.parent.name
    if path.parent.name != "snapshots" or not repo.startswith("models--"):
        return None
    if not COMMIT.match(path.name):
        return None
    return {"hub_id": repo.removeprefix("models--").replace("--", "/"), "commit": path.name}


def not_a_model(name: str, flag: str = "--model") -> str | None:
    """The one-line problem with a model argument that is neither a folder nor a Hub id."""
    if Path(name).is_dir() or HUB_ID.match(name):
        return None
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:  # meant as a path
        return f"{name}: {flag}: no such model folder"
    return f"{name}: {flag}: no such model folder, and not a Hugging Face Hub id (ORG/NAME)"


def check_revision(revision: str | None) -> str:
    """The revision to ask for (None is `main`); an empty one is refused, never taken as `main`
    silently (an unset shell variable in `--model-revision "$REV"`)."""
    if revision is None:
        return "main"
    if not revision.strip():
        raise UserError(
            f"--model-revision: empty ({revision!r}); name a branch, tag or commit, or leave the "
            "flag out for main"
        )
    return revision


def resolve_model(
    name: str | os.PathLike, revision: str = "main", weights: bool = True, flag: str = "--model"
):
    """The `ResolvedModel` for a model argument; `weights=False` fetches config and tokenizer only.

    Raises a one-line `UserError` for a malformed id, an unknown id or revision, a gated or
    private repository without a token, offline with no cached copy, a repository without
    safetensors weights, and an incomplete snapshot.
    """
    text = str(name)
    revision = check_revision(revision)
    if Path(text).is_dir():
        if not (Path(text) / "config.json").is_file():
            raise UserError(
                f"{text}: {flag}: no config.json (expected a Hugging Face model folder)"
            )
        return ResolvedModel(Path(text), None)
    if problem := not_a_model(text, flag):
        raise UserError(problem)
    folder = Path(_snapshot(text, revision, weights))
    check_snapshot(folder, text, revision, weights)
    return ResolvedModel(folder, folder.name, text, revision)


def _snapshot(hub_id: str, revision: str, weights: bool) -> str:
    """snapshot_download with our patterns, its errors turned into one line each."""
    # deferred: huggingface_hub; a local model folder never loads it
    from huggingface_hub import snapshot_download

    allow = ALLOW_PATTERNS if weights else [p for p in ALLOW_PATTERNS if p != "*.safetensors"]
    with hub_errors(hub_id, revision):
        return snapshot_download(
            hub_id,
            revision=revision,
            cache_dir=hub_cache_dir(),
            local_files_only=offline(),
            allow_patterns=allow,
            ignore_patterns=IGNORE_PATTERNS,
            endpoint=os.environ.get("HF_ENDPOINT") or None,
        )


def lookup_commit(hub_id: str, revision: str = "main") -> str:
    """The commit `revision` names now, without fetching any file: one Hub call online, the
    cache's `refs/` offline, nothing for a commit. (The pipeline keys its runs by it.)"""
    # deferred: huggingface_hub (as in _snapshot)
    from huggingface_hub import HfApi

    revision = check_revision(revision)
    if COMMIT.match(revision):
        return revision
    if problem := not_a_model(hub_id):
        raise UserError(problem)
    with hub_errors(hub_id, revision):
        api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
        return api.resolve_revision(
            hub_id, revision=revision, cache_dir=hub_cache_dir(), local_files_only=offline()
        ).resolved


def moved_branch_line(hub_id: str, recorded: str, now: str) -> str:
    """The one line for a resume whose revision now names another commit than the run's."""
    return (
        f"--model-revision: the state started from {hub_id} commit {recorded}, this run "
        f"resolved {hub_id} to commit {now} (the Hub's branch moved?); to continue the run, "
        f"pin it: --model-revision {recorded}"
    )


def recorded_commit(out_dir: Path, hub_id: str) -> str | None:
    """The commit a run in `out_dir` started from (its training_args.json), if it is a run of
    `hub_id`; None for a new folder or a local model."""
    try:
        record = json.loads((out_dir / "training_args.json").read_text())
        source = hub_source(record["model_name_or_path"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return source["commit"] if source and source["hub_id"] == hub_id else None


def decide_commit(hub_id: str, revision: str | None, resume_dir: Path | None = None) -> str:
    """The commit a job trains from, decided without fetching any file (`lookup_commit`); with
    `resume_dir`, a revision that now names another commit than the run recorded is refused
    here, before anything of that commit is downloaded."""
    commit = lookup_commit(hub_id, revision)
    recorded = recorded_commit(resume_dir, hub_id) if resume_dir is not None else None
    if recorded is not None and commit != recorded:
        raise UserError(moved_branch_line(hub_id, recorded, commit))
    return commit


@contextlib.contextmanager
def hub_errors(hub_id: str, revision: str):
    """huggingface_hub's errors as one-line `UserError`s that say what to do."""
    # deferred: huggingface_hub (as in _snapshot)
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
        RevisionResolutionError,
    )

    cache = hub_cache_dir()
    where = f"{hub_id} (revision {revision})"
    fetch = FETCH_HINT.format(id=hub_id, rev=revision)
    login = "log in with `hf auth login` or set HF_TOKEN"
    try:
        yield
    except GatedRepoError:
        raise UserError(
            f"{hub_id}: gated repository: {login}, with an account that accepted its terms"
        ) from None
    except RepositoryNotFoundError:
        raise UserError(
            f"{hub_id}: no such repository on the Hugging Face Hub, or it is private "
            f"({login} if it is yours)"
        ) from None
    except RevisionNotFoundError:
        raise UserError(f"{hub_id}: no revision {revision!r} (a branch, tag or commit)") from None
    except HFValidationError as error:
        raise UserError(f"{hub_id}: not a valid Hub id or revision ({error})") from None
    except (LocalEntryNotFoundError, RevisionResolutionError) as error:
        if type(error).__name__ == "IncompleteSnapshotError":
            raise UserError(
                f"{where}: the cached snapshot under {repo_folder(hub_id, cache)} is incomplete "
                f"(an interrupted download?); complete it with network access: {fetch}"
            ) from None
        reason = "offline (HF_HUB_OFFLINE)" if offline() else "the Hub cannot be reached"
        if stale := _dangling_ref(repo_folder(hub_id, cache), revision):
            raise UserError(
                f"{where}: {reason}, and the cache's refs/{revision} names commit {stale}, "
                f"which has no snapshot in the cache (a snapshot deleted by hand?); fill it on a "
                f"host with network access: {fetch}"
            ) from None
        raise UserError(
            f"{where}: {reason} and no cached copy in {repo_folder(hub_id, cache)}; "
            f"fill the cache on a host with network access: {fetch}"
        ) from None
    except OSError as error:  # a network, disk or HTTP error not classified above
        raise UserError(f"{where}: cannot fetch the model: {_first_line(error)}") from None


def _dangling_ref(repo: Path, revision: str) -> str | None:
    """The commit `refs/<revision>` names when that commit has no snapshot folder, else None."""
    try:
        commit = (repo / "refs" / revision).read_text().strip()
    except (OSError, ValueError):
        return None
    return commit if COMMIT.match(commit) and not (repo / "snapshots" / commit).is_dir() else None


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def check_snapshot(folder: Path, hub_id: str, revision: str, weights: bool = True) -> None:
    """Refuse a snapshot missing config.json or any safetensors file its index names.

    huggingface_hub links a file into the snapshot only once its blob is complete, so a
    download interrupted half-way leaves files missing (or links dangling), never a short file.
    """
    fetch = FETCH_HINT.format(id=hub_id, rev=revision)
    where = f"{hub_id} (commit {folder.name})"
    missing = [] if (folder / "config.json").is_file() else ["config.json"]
    if weights:
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError) as error:
                raise UserError(f"{index}: not a readable safetensors index ({error})") from None
            missing += [name for name in shards if not (folder / name).is_file()]
        elif not any(path.is_file() for path in folder.glob("*.safetensors")):
            listed = tree_listing(folder)
            if listed is None and not missing:
                raise UserError(
                    f"{where}: no safetensors weights in the cached snapshot {folder} (the "
                    "repository has none, or a download was interrupted: pickled weights are "
                    f"never loaded); with network access: {fetch}"
                )
            if listed is not None and not any(_is_weights(name) for name in listed):
                others = sorted(n for n in listed if n.endswith((".bin", ".pth", ".pt")))
                has = f" (it has {', '.join(others[:2])})" if others else ""
                raise UserError(
                    f"{where}: no safetensors weights{has}; pickled weights are never loaded: "
                    "choose a repository or revision that has *.safetensors"
                )
            missing += sorted(n for n in listed or ["model.safetensors"] if _is_weights(n))
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise UserError(
            f"{where}: the cached snapshot {folder} is incomplete (missing {shown}; an "
            f"interrupted download?); complete it with network access: {fetch}"
        )


def _is_weights(name: str) -> bool:
    return "/" not in name and name.endswith(".safetensors")


def tree_listing(folder: Path) -> list[str] | None:
    """The repository's files at the snapshot's commit, from the tree listing huggingface_hub
    caches beside the snapshots (`trees/<COMMIT>.json`); None when it was not cached."""
    path = folder.parent.parent / "trees" / f"{folder.name}.json"
    try:
        return list(json.loads(path.read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resolve_once_per_node(
    name: str | os.PathLike, revision: str = "main", weights: bool = True, flag: str = "--model"
):
    """`resolve_model` under torchrun without N downloads: local rank 0 resolves, and the node's
    other ranks wait for its answer (a small file), so they need no process group yet and a
    problem still stops every rank before one starts. A lone process just resolves."""
    if Path(str(name)).is_dir() or int(os.environ.get("LOCAL_WORLD_SIZE", "1")) <= 1:
        return resolve_model(name, revision, weights, flag)
    answer = _answer_path(str(name), revision, weights)
    if env_world()[1] == 0:
        reply: dict = {"error": [f"{name}: local rank 0 could not resolve the model"]}
        try:
            resolved = resolve_model(name, revision, weights, flag)
            reply = {"model": resolved.record()}
            return resolved
        except UserError as error:
            reply = {"error": error.lines}
            raise
        finally:
            _write_answer(answer, reply)
    parent = os.getppid()
    while not answer.is_file():
        if os.getppid() != parent:  # the launcher is gone: nobody will answer
            raise UserError(f"{name}: the launcher exited while local rank 0 resolved the model")
        time.sleep(0.05)
    reply = json.loads(answer.read_text())
    if "error" in reply:
        raise UserError(*reply["error"])
    record = reply["model"]
    return ResolvedModel(Path(record["folder"]), record["commit"], record["hub_id"],
                         record["revision"])  # fmt: skip


def _answer_path(name: str, revision: str, weights: bool) -> Path:
    """A file name unique to this launch of the job on this node (same for all its ranks)."""
    key = "\0".join([
        os.environ.get("TORCHELASTIC_RUN_ID", ""), os.environ.get("TORCHELASTIC_RESTART_COUNT", ""),
        os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""), str(os.getppid()),
        _start_time(os.getppid()), name, revision, str(weights),
    ])  # fmt: skip
    digest = hashlib.sha1(key.encode()).hexdigest()
    return Path(tempfile.gettempdir()) / f"mini_trainer-{os.getuid()}" / f"resolve-{digest}.json"


def _start_time(pid: int) -> str:
    """When process `pid` started (clock ticks since boot, from /proc; '' where there is none):
    with the pid it names one launcher for good, so an answer file left by an earlier launcher
    whose pid was later reused (a long-lived /tmp, a container's repeated pid sequence) is never
    taken for this launch's."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def _write_answer(path: Path, reply: dict) -> None:
    atomic_write_text(path, json.dumps(reply))
