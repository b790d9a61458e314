"""`--resume`: which state a run continues from, checked for damage and for being the same run.

Rank 0 decides (`pick_state`), so every rank loads the same state. The rules:
- no run in the output folder (nothing trained yet): start from step 0;
- a run but no state at all: refuse (starting over would rewind `metrics.jsonl` and the record);
- the newest state damaged (a shard shorter than its metadata says, `.metadata`, the trainer
  state or an RNG file that does not load): fall back to the newest intact one with a warning,
  and move the damaged ones aside to `state/.damaged-step_<K>` so they are neither pruned in
  place of good ones nor picked again; none intact: refuse;
- the chosen state's fingerprint (training/fingerprint.py) differs from this run's: refuse,
  one line per difference.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import time
from pathlib import Path

import torch

from mini_trainer.errors import UserError
from mini_trainer.training.checkpoint import STATE_PATTERN, TRAINER_STATE
from mini_trainer.training.distributed import Runtime, decided_on_main
from mini_trainer.training.fingerprint import MAY_CHANGE_ON_RESUME, differences

log = logging.getLogger("mini_trainer")

RESUMES_FILE = "resumes.jsonl"
"""One line per resume: when, from which state, and which may-change options changed."""


def damage(path: Path) -> str | None:
    """Why the state folder `path` cannot be resumed from, or None when every file checks out.

    Reads the DCP metadata and compares every shard file's size with the bytes the metadata
    expects in it; loads the trainer state and every RNG file. It does not read the tensors
    themselves (a same-size corruption inside a shard is not detected).
    """
    try:
        trainer_state = json.loads((path / TRAINER_STATE).read_text())
        trainer_state["progress"]["step"]  # noqa: B018 (a KeyError means a torn state)
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"{TRAINER_STATE} does not load ({type(error).__name__})"
    try:
        with open(path / ".metadata", "rb") as handle:
            metadata = pickle.load(handle)
        storage = metadata.storage_data
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
    return None


def _states(out_dir: Path) -> list[tuple[int, Path]]:
    root = out_dir / "state"
    if not root.is_dir():
        return []
    found = [
        (int(match.group(1)), path)
        for path in root.iterdir()
        if (match := STATE_PATTERN.match(path.name)) and path.is_dir()
    ]
    return sorted(found, reverse=True)


def _trained_steps(out_dir: Path) -> int:
    """Rows in metrics.jsonl (0 when there is none): how far a run got."""
    try:
        return sum(1 for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line)
    except OSError:
        return 0


def choose_state(out_dir: Path, fingerprint: dict | None) -> Path | None:
    """Rank 0: the state to resume from, None for a fresh start, or `UserError` (see module)."""
    states = _states(out_dir)
    if not states:
        steps = _trained_steps(out_dir)
        finished = [name for name in ("final", "hf_format") if (out_dir / name).exists()]
        if steps or finished:
            ran = f"metrics.jsonl has {steps} steps" if steps else f"it has {finished[0]}/"
            raise UserError(
                f"{out_dir}: --resume: the folder holds a run ({ran}) but no saved state to "
                "continue from (pass --save-every-steps to save states); use a new --output-dir"
            )
        return None
    damaged = []
    for _, path in states:
        reason = damage(path)
        if reason is None:
            break
        damaged.append((path, reason))
    else:
        raise UserError(
            *(f"{path}: damaged: {reason}" for path, reason in damaged),
            f"{out_dir}: --resume: no intact state to continue from; use a new --output-dir",
        )
    for bad, reason in damaged:
        aside = bad.parent / f".damaged-{bad.name}"
        os.replace(bad, aside)
        log.warning("%s: damaged (%s); moved to %s, resuming from %s", bad, reason, aside, path)
    if fingerprint is not None:
        saved = json.loads((path / TRAINER_STATE).read_text()).get("fingerprint")
        if saved is None:
            log.warning("%s: no fingerprint (saved by an older version): not compared", path)
        elif problems := differences(saved, fingerprint):
            raise UserError(
                *(f"{path}: --resume: {line}" for line in problems),
                f"{path}: --resume: refused: this is not the run the state belongs to "
                "(use a new --output-dir for a different run)",
            )
    return path


def pick_state(out_dir: Path, resume: bool, fingerprint: dict | None, runtime: Runtime):
    """The state every rank resumes from (None: step 0); rank 0 chooses, errors reach all."""
    if not resume:  # the same on every rank: no collective needed
        return None
    return decided_on_main(lambda: choose_state(out_dir, fingerprint), runtime)


def record_start(out_dir: Path, args, resumed_from: Path | None, step: int) -> None:
    """Rank 0: write training_args.json for a new run; for a resume, append to resumes.jsonl.

    training_args.json is the record of the run as it started and is never rewritten; options
    that may change on resume and did are listed in the resume record.
    """
    from dataclasses import asdict

    from mini_trainer.io_utils import atomic_write_text

    current = asdict(args)
    args_file = out_dir / "training_args.json"
    if resumed_from is None or not args_file.exists():
        atomic_write_text(args_file, json.dumps(current, indent=2) + "\n")
        return
    try:
        first = json.loads(args_file.read_text())
    except ValueError:
        first = {}
    changed = {
        name: {"was": first.get(name), "now": current[name]}
        for name in MAY_CHANGE_ON_RESUME
        if name != "resume" and name in current and first.get(name) != current[name]
    }
    record = {
        "timestamp": time.time(),
        "state": str(resumed_from),
        "step": step,
        "changed": changed,
    }
    with open(out_dir / RESUMES_FILE, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def newest_intact_name(out_dir: Path) -> str:
    """For messages: the newest intact state's path, or "none"."""
    for _, path in _states(Path(out_dir)):
        if damage(path) is None:
            return str(path)
    return "none"
