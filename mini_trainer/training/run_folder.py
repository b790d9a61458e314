"""What an output folder holds, and what a new job may do with it: the one place that decides.

`classify` reads a folder and says which of five kinds it is:
- FRESH: nothing trained (no folder, an empty one, only `training_args.json`, an empty
  `metrics.jsonl`);
- RESUMABLE: `state/step_<K>/` folders, the newest intact one being `state`;
- DAMAGED: `state/step_<K>/` folders, none intact;
- UNSAVED: an attempt ran (steps in `metrics.jsonl`, or `hf_format/` exports) but saved no state
  and did not finish;
- FINISHED: `final/` exists and there is no state.

A state is intact by one rule, `damage` (also used by the divergence message and resume): the
trainer state loads (`TrainerState`), the DCP `.metadata` loads and no shard is shorter than it
says, every `rng_rank<r>.pt` loads, and, for states saved with checksums, every file matches
`checksums.json` (`state_checksums.py`). `start_decision` then maps (kind, `--resume` mode) to
start, resume, move the attempt aside, or a refusal; `train.py:check_inputs` (before any worker,
without reading state contents) and rank 0 of the job (after taking the folder's lock, with
contents) call the same two functions, so the launcher, the engine and the pipeline's one
command agree.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import json
import logging
import os
import pickle
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_write_text
from mini_trainer.training import state_checksums
from mini_trainer.training.trainer_state import TRAINER_STATE, TornTrainerState, TrainerState

log = logging.getLogger("mini_trainer")

STATE_PATTERN = re.compile(r"^step_(\d+)$")
STOPPED_BY_ERROR = "stopped_by_error.json"
"""Written when bad input stops an attempt that saved no state: the next run may start over."""
EXPORTS = ("final", "hf_format")
KEEP_IN_PLACE = (".lock",)
"""What a move-aside leaves in the folder: the lock the moving job holds."""


class Kind(enum.Enum):
    FRESH = "fresh"
    RESUMABLE = "resumable"
    DAMAGED = "damaged"
    UNSAVED = "unsaved"
    FINISHED = "finished"


START, RESUME, MOVE_ASIDE = "start", "resume", "move-aside"


@dataclass(frozen=True)
class RunFolder:
    """One output folder as `classify` found it."""

    path: Path
    kind: Kind
    state: Path | None = None
    """RESUMABLE: the newest intact state."""
    damaged: tuple[tuple[Path, str], ...] = ()
    """States newer than `state` (all of them when DAMAGED), each with why it is damaged."""
    steps: int = 0
    """Rows in metrics.jsonl."""
    exports: tuple[str, ...] = ()
    """Which of final/ and hf_format/ exist."""
    started: bool = False
    """metrics.jsonl or state/ exists: a job got past its start here."""
    stopped_by_error: bool = False
    """The last attempt was stopped by bad input before saving a state (STOPPED_BY_ERROR)."""


def state_dirs(out_dir: Path) -> list[tuple[int, Path]]:
    """The published `state/step_<K>/` folders, newest first (no temporary or moved-aside ones)."""
    root = Path(out_dir) / "state"
    if not root.is_dir():
        return []
    found = [
        (int(match.group(1)), path)
        for path in root.iterdir()
        if (match := STATE_PATTERN.match(path.name)) and path.is_dir()
    ]
    return sorted(found, reverse=True)


def damage(path: Path, verify_contents: bool = True, verify=None) -> str | None:
    """Why the state folder `path` cannot be resumed from, or None when it is intact.

    Without `verify_contents`, the checksums are not recomputed (only the small files are
    read): the quick check `check_inputs` makes before any worker starts. `verify(path)` gives
    the checksums' verdict (default: `state_checksums.verify`, this process alone).
    """
    try:
        trainer_state = TrainerState.read(path)
    except (OSError, TornTrainerState) as error:
        return f"{TRAINER_STATE} does not load ({error.args[0] if error.args else error})"
    try:
        with open(path / ".metadata", "rb") as handle:
            storage = pickle.load(handle).storage_data
    except Exception as error:  # noqa: BLE001 (any unpickling failure means a damaged file)
        return f".metadata does not load ({type(error).__name__})"
    needed: dict[str, int] = {}
    for info in storage.values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, size in sorted(needed.items()):
        try:
            actual = os.path.getsize(path / name)
        except OSError:
            return f"{name} is missing"
        if actual < size:
            return f"{name} has {actual} bytes, its metadata expects at least {size}"
    rng_files = sorted(path.glob("rng_rank*.pt"))
    if not rng_files:
        return "no RNG state (rng_rank*.pt)"
    for rng_file in rng_files:
        try:
            torch.load(rng_file, weights_only=False)
        except Exception as error:  # noqa: BLE001 (a torn pickle raises many kinds)
            return f"{rng_file.name} does not load ({type(error).__name__})"
    if verify_contents and trainer_state.has_checksums:
        return (verify or state_checksums.verify)(path)
    return None


def states_to_verify(out_dir: Path) -> list[Path]:
    """The states whose checksums `classify` would verify, newest first: those that pass the
    quick check, up to the first one saved without checksums (which `classify` takes as is)."""
    found = []
    for _, path in state_dirs(out_dir):
        if damage(path, verify_contents=False) is not None:
            continue
        try:
            if not TrainerState.read(path).has_checksums:
                break
        except (OSError, TornTrainerState):
            continue
        found.append(path)
    return found


def trained_steps(out_dir: Path) -> int:
    """Rows in metrics.jsonl (0 when there is none): how far a run got."""
    try:
        return sum(1 for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line)
    except OSError:
        return 0


def classify(out_dir: str | os.PathLike, verify_contents: bool = True, verify=None) -> RunFolder:
    """What `out_dir` holds (see the module). Reads; changes nothing. `verify`: as `damage`'s."""
    out = Path(out_dir)
    facts = {
        "steps": trained_steps(out),
        "exports": tuple(name for name in EXPORTS if (out / name).exists()),
        "started": (out / "metrics.jsonl").exists() or (out / "state").exists(),
        "stopped_by_error": (out / STOPPED_BY_ERROR).exists(),
    }
    states = state_dirs(out)
    if states:
        damaged = []
        for _, path in states:
            reason = damage(path, verify_contents, verify)
            if reason is None:
                return RunFolder(out, Kind.RESUMABLE, path, tuple(damaged), **facts)
            damaged.append((path, reason))
        return RunFolder(out, Kind.DAMAGED, None, tuple(damaged), **facts)
    if "final" in facts["exports"]:
        return RunFolder(out, Kind.FINISHED, **facts)
    if facts["steps"] or facts["exports"]:
        return RunFolder(out, Kind.UNSAVED, **facts)
    return RunFolder(out, Kind.FRESH, **facts)


def start_decision(folder: RunFolder, resume: bool | str) -> str:
    """START, RESUME or MOVE_ASIDE for a job with this `--resume` mode, or `UserError`.

    - no `--resume`: only a fresh folder (nothing there that a job wrote);
    - `--resume`: fresh (start) or resumable (resume); anything else is refused;
    - `--resume auto`: the same, and an unsaved attempt is moved aside (then start);
    - in every mode, an attempt that bad input stopped before its first state is moved aside,
      so the same command runs again once the input is fixed.
    """
    out, kind = folder.path, folder.kind
    if folder.stopped_by_error and kind in (Kind.FRESH, Kind.UNSAVED):
        return MOVE_ASIDE
    if kind is Kind.UNSAVED and resume == "auto":
        return MOVE_ASIDE
    if not resume:
        if kind is Kind.FRESH and not folder.started:
            return START
        hint = "pass --resume to continue it"
        if kind in (Kind.UNSAVED, Kind.FINISHED):
            hint = (
                "it saved no state to continue from: pass --resume auto to keep it aside and "
                "start over"
            )
        raise UserError(
            f"{out}: --output-dir already holds a training run ({hint}, or choose another folder)"
        )
    if kind is Kind.FRESH:
        return START
    if kind is Kind.RESUMABLE:
        return RESUME
    if kind is Kind.DAMAGED:
        raise UserError(
            *(f"{path}: damaged: {reason}" for path, reason in folder.damaged),
            f"{out}: --resume: no intact state to continue from; use a new --output-dir",
        )
    ran = (
        f"metrics.jsonl has {folder.steps} steps"
        if folder.steps
        else f"it has {folder.exports[0]}/"
    )
    if kind is Kind.FINISHED:
        raise UserError(
            f"{out}: --resume: the folder holds a run ({ran}) but no saved state to continue "
            "from (it finished: final/ exists); use a new --output-dir"
        )
    raise UserError(
        f"{out}: --resume: the folder holds a run ({ran}) but no saved state to continue from "
        "(pass --save-every-steps to save states); use --resume auto to keep it aside and "
        "start over, or a new --output-dir"
    )


def move_aside(out_dir: Path) -> Path:
    """Move everything of `out_dir` but its lock into `<out_dir>.unsaved-<UTC time>`; return it.

    The job that calls this holds the folder's lock (rank 0, in `train`), so the folder itself
    stays, with its lock; nothing is deleted.
    """
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = out_dir.with_name(f"{out_dir.name}.unsaved-{stamp}")
    suffix = 1
    while aside.exists():
        suffix += 1
        aside = out_dir.with_name(f"{out_dir.name}.unsaved-{stamp}-{suffix}")
    aside.mkdir()
    for path in sorted(out_dir.iterdir()):
        if path.name not in KEEP_IN_PLACE:
            os.replace(path, aside / path.name)
    return aside


@contextlib.contextmanager
def recording_bad_input(out_dir: Path, progress) -> Iterator[None]:
    """Around a run's steps and export: a `UserError` of bad input (exit 2: data, a failed
    write) in an attempt with no saved state is recorded (`record_stopped_by_error`)."""
    try:
        yield
    except UserError as error:
        if error.exit_code == 2:
            record_stopped_by_error(out_dir, progress.step, error.lines)
        raise


def record_stopped_by_error(out_dir: Path, step: int, lines: list[str]) -> None:
    """After bad input stopped an attempt that saved no state: let the next run start over.

    Best effort (a full disk may refuse even this small file: then `--resume auto` still does).
    """
    if state_dirs(out_dir):
        return
    record = {"time": time.time(), "step": step, "lines": lines}
    with contextlib.suppress(OSError):
        atomic_write_text(out_dir / STOPPED_BY_ERROR, json.dumps(record, indent=1) + "\n")


def newest_intact_name(out_dir: Path) -> str:
    """For messages: the newest intact state's path, or "none"."""
    folder = classify(out_dir)
    return str(folder.state) if folder.state is not None else "none"
