"""The report manifest: which file is which cell of the experiment (CONTRACTS.md, MANIFEST.json).

The pipeline knows every file's place (method, learning rate, stage, task) from its config;
`mini-trainer manifest` writes that down so `mini-trainer report` never has to guess it from
paths. Paths are written as given (relative to the pipeline's working folder). The manifest does
not check that the files exist: a missing file is a missing cell in the report, never invented.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from mini_trainer.data.outputs import check_writable
from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_write_text

BASE_MARK = "-"
"""Method and learning rate of the base model's entries on the command line (JSON null)."""


@dataclass(frozen=True)
class EvalEntry:
    path: str
    method: str | None
    lr: float | None
    stage: int
    task: str

    def to_json(self) -> dict:
        return {"kind": "eval", "path": self.path, "method": self.method, "lr": self.lr,
                "stage": self.stage, "task": self.task}  # fmt: skip


@dataclass(frozen=True)
class RunEntry:
    path: str
    method: str
    lr: float
    stage: int

    def to_json(self) -> dict:
        return {"kind": "run", "path": self.path, "method": self.method, "lr": self.lr,
                "stage": self.stage}  # fmt: skip


def parse_eval(fields: tuple[str, str, str, str, str]) -> EvalEntry:
    """`PATH METHOD LR STAGE TASK`; METHOD and LR are `-` for the base model (stage 0)."""
    path, method, lr, stage, task = fields
    where = f"--eval {' '.join(fields)}"
    stage_number = _stage(stage, where)
    if method == BASE_MARK or lr == BASE_MARK:
        if (method, lr, stage_number) != (BASE_MARK, BASE_MARK, 0):
            raise UserError(f"{where}: the base model is METHOD - LR - STAGE 0")
        return EvalEntry(path, None, None, 0, task)
    if stage_number < 1:
        raise UserError(f"{where}: STAGE of a trained checkpoint starts at 1")
    return EvalEntry(path, method, _lr(lr, where), stage_number, task)


def parse_run(fields: tuple[str, str, str, str]) -> RunEntry:
    """`PATH METHOD LR STAGE` of a training output folder."""
    path, method, lr, stage = fields
    where = f"--run {' '.join(fields)}"
    stage_number = _stage(stage, where)
    if stage_number < 1:
        raise UserError(f"{where}: STAGE starts at 1")
    return RunEntry(path, method, _lr(lr, where), stage_number)


def build_manifest(
    tasks: list[str],
    evals: list[EvalEntry],
    runs: list[RunEntry],
    data_summaries: list[tuple[str, str]],
) -> dict:
    """The manifest as a JSON-ready dict; refuses what would make the report ambiguous."""
    if not tasks:
        raise UserError("--task: give the stage tasks in order (at least one)")
    if len(set(tasks)) != len(tasks):
        raise UserError(f"--task: a task is given twice: {', '.join(tasks)}")
    for entry in evals:
        if entry.task not in tasks:
            raise UserError(f"--eval {entry.path}: task {entry.task!r} is not a --task")
    for entry in [*evals, *runs]:
        if entry.stage > len(tasks):
            raise UserError(f"{entry.path}: stage {entry.stage} but only {len(tasks)} tasks")
    cells = [(e.method, e.lr, e.stage, e.task) for e in evals]
    _refuse_duplicates("--eval", cells)
    _refuse_duplicates("--run", [(r.method, r.lr, r.stage) for r in runs])
    entries = [e.to_json() for e in evals] + [r.to_json() for r in runs]
    entries += [
        {"kind": "data_summary", "path": path, "task": task} for path, task in data_summaries
    ]
    return {"tasks": list(tasks), "entries": entries}


def check_manifest_out(path: str | os.PathLike, force: bool) -> None:
    """Refuse an output that exists (unless `force`) or cannot be written, before any work."""
    if os.path.exists(path) and not force:
        raise UserError(f"{path}: already exists (pass --force to replace it)")
    check_writable(Path(path).parent, "--out")


def write_manifest(path: str | os.PathLike, manifest: dict, force: bool) -> None:
    check_manifest_out(path, force)
    atomic_write_text(path, json.dumps(manifest, indent=2) + "\n")


def _stage(text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{where}: STAGE must be an integer, got {text!r}") from None


def _lr(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{where}: LR must be a number, got {text!r}") from None
    if not value > 0:
        raise UserError(f"{where}: LR must be > 0, got {text}")
    return value


def _refuse_duplicates(flag: str, keys: list[tuple]) -> None:
    seen = set()
    for key in keys:
        if key in seen:
            raise UserError(f"{flag}: two entries for the same cell {key}")
        seen.add(key)
