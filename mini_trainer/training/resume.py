"""`--resume`: which state a run continues from, checked for damage and for being the same run.

Rank 0 decides (`pick_state`), so every rank loads the same state. What the folder holds and
what each `--resume` mode may do with it is `run_folder.py`'s (`classify`, `start_decision`);
here the decision is carried out:
- start: from step 0;
- move aside (an unsaved attempt under `--resume auto`, or an attempt that bad input stopped
  before its first state): everything but the lock goes to `<out>.unsaved-<UTC time>`, one
  line says so, and the run starts from step 0;
- resume: damaged states newer than the intact one are moved aside to `state/.damaged-step_<K>`
  with a warning (so they are neither pruned in place of good ones nor picked again), and the
  chosen state's fingerprint (training/fingerprint.py) must equal this run's: else refused,
  one line per difference.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

from mini_trainer.distributed.runtime import Runtime, broadcast_object, decided_on_main
from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_write_text
from mini_trainer.training import run_folder, state_checksums
from mini_trainer.training.fingerprint import MAY_CHANGE_ON_RESUME, differences
from mini_trainer.training.run_folder import damage  # noqa: F401 (re-exported for callers)
from mini_trainer.training.trainer_state import TrainerState

log = logging.getLogger("mini_trainer")

RESUMES_FILE = "resumes.jsonl"
"""One line per resume: when, from which state, and which may-change options changed."""


def choose_state(
    out_dir: Path, fingerprint: dict | None, resume: bool | str = True, verdicts=None
) -> Path | None:
    """Rank 0: the state to resume from, None for a start from step 0, or `UserError`.
    `verdicts`: {state: checksum problem or None} found by every rank (`shared_verdicts`);
    a state not in it is verified here."""
    verify = None
    if verdicts is not None:

        def verify(path: Path) -> str | None:
            return verdicts[path] if path in verdicts else state_checksums.verify(path)

    folder = run_folder.classify(out_dir, verify=verify)
    decision = run_folder.start_decision(folder, resume)
    if decision == run_folder.MOVE_ASIDE:
        aside = run_folder.move_aside(Path(out_dir))
        log.warning(
            "no saved state in %s: the earlier attempt is kept in %s, training starts over",
            out_dir, aside,
        )  # fmt: skip
        return None
    if decision == run_folder.START:
        return None
    path = folder.state
    assert path is not None
    for bad, reason in folder.damaged:
        aside = bad.parent / f".damaged-{bad.name}"
        os.replace(bad, aside)
        log.warning("%s: damaged (%s); moved to %s, resuming from %s", bad, reason, aside, path)
    if fingerprint is not None:
        saved = TrainerState.read(path).fingerprint
        if saved is None:
            log.warning("%s: no fingerprint (saved by an older version): not compared", path)
        elif problems := differences(saved, fingerprint):
            raise UserError(
                *(f"{path}: --resume: {line}" for line in problems),
                f"{path}: --resume: refused: this is not the run the state belongs to "
                "(use a new --output-dir for a different run)",
            )
    return path


def shared_verdicts(out_dir: Path, runtime: Runtime | None) -> dict[Path, str | None]:
    """Every rank together: the checksum verdicts of the states `choose_state` will consider,
    newest first up to the first intact one, each state's hashing shared by the ranks."""
    grouped = runtime is not None and runtime.world_size > 1
    main = not grouped or runtime.is_main
    candidates = run_folder.states_to_verify(Path(out_dir)) if main else None
    if grouped:
        candidates = broadcast_object(candidates, runtime)
    verdicts: dict[Path, str | None] = {}
    for path in candidates:
        verdicts[path] = state_checksums.verify_shared(path, runtime)
        if verdicts[path] is None:
            break
    return verdicts


def pick_state(out_dir: Path, resume: bool | str, fingerprint: dict | None, runtime: Runtime):
    """The state every rank resumes from (None: step 0); rank 0 chooses, errors reach all.
    Every rank verifies a share of the checksums first: a mismatch any rank sees counts."""
    verdicts = shared_verdicts(out_dir, runtime) if resume else None
    return decided_on_main(lambda: choose_state(out_dir, fingerprint, resume, verdicts), runtime)


def record_start(out_dir: Path, args, resumed_from: Path | None, step: int) -> None:
    """Rank 0: write training_args.json for a new run; for a resume, append to resumes.jsonl.

    training_args.json is the record of the run as it started and is never rewritten; options
    that may change on resume and did are listed in the resume record.
    """
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
