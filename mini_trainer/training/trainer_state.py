"""`trainer_state.json` of a saved state: what besides the weights and optimizer a resume needs.

One owner for the file's schema: the loop builds a `TrainerState`, `checkpoint.save_state` writes
it (`to_json`), resume reads it back (`TrainerState.read`) and the damage check
(`run_folder.damage`) uses the same reader, so "the trainer state loads" means the same thing
everywhere. `SCHEMA_VERSION` 2 added the version itself and the per-file checksums of the state
(`state_checksums.py`); a state without a version was saved by an older mini-trainer and is
read as version 1 (no checksums to verify).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

TRAINER_STATE = "trainer_state.json"
SCHEMA_VERSION = 2
"""2: adds `version` and a `checksums.json` beside it; 1 (no `version` key): neither."""


@dataclass
class Progress:
    """Counters that survive a resume."""

    step: int = 0
    samples_seen: int = 0
    loss_tokens_seen: int = 0
    samples_at_last_checkpoint: int = 0


class TornTrainerState(ValueError):
    """The file does not parse or lacks what a resume needs (a torn or foreign file)."""


@dataclass
class TrainerState:
    """Progress, sampler position, scheduler, and the run's fingerprint (fingerprint.py)."""

    progress: Progress = field(default_factory=Progress)
    sampler: dict = field(default_factory=dict)
    scheduler: dict = field(default_factory=dict)
    fingerprint: dict | None = None
    validation: dict | None = None
    """The validation tracker's best value, its step and the patience count (None without)."""
    version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> TrainerState:
        """Parse; raise `TornTrainerState` for anything a resume could not use."""
        try:
            raw = json.loads(text)
            progress = Progress(**raw["progress"])
            int(progress.step)
            return cls(
                progress=progress,
                sampler=raw.get("sampler", {}),
                scheduler=raw.get("scheduler", {}),
                fingerprint=raw.get("fingerprint"),
                validation=raw.get("validation"),
                version=int(raw.get("version", 1)),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise TornTrainerState(type(error).__name__) from None

    @classmethod
    def read(cls, state_dir: Path) -> TrainerState:
        """The trainer state of the state folder `state_dir` (OSError if it is missing)."""
        return cls.from_json((Path(state_dir) / TRAINER_STATE).read_text())

    @property
    def has_checksums(self) -> bool:
        """Whether the state was saved with `checksums.json` (schema 2 on)."""
        return self.version >= 2
