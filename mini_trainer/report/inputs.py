"""What the report reads: the manifest, training run folders, evaluate JSONs, data summaries.

A malformed manifest is the user's mistake and stops the report (`UserError`, one line per
problem). A file the manifest points to that is missing or unreadable is a fact about the
experiment (a failed or unfinished job): it is recorded with its reason and shown as missing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from mini_trainer.errors import UserError
from mini_trainer.validation_options import VAL_METRICS

KINDS = ("eval", "run", "data_summary")


@dataclass(frozen=True)
class Entry:
    """One manifest entry."""

    kind: str
    path: Path
    method: str | None = None
    lr: float | None = None
    stage: int | None = None
    task: str | None = None


@dataclass
class Manifest:
    tasks: list[str]
    entries: list[Entry]


@dataclass
class EvalResult:
    """An evaluate JSON, or why it could not be used (`problem`)."""

    path: Path
    data: dict | None
    problem: str | None = None

    @property
    def accuracy(self) -> float | None:
        value = (self.data or {}).get("token_accuracy")
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok and math.isfinite(value) else None


@dataclass
class RunData:
    """A training output folder: its metrics rows and resolved arguments."""

    path: Path
    label: str
    rows: list[dict] = field(default_factory=list)
    args: dict | None = None
    problem: str | None = None
    best: dict | None = None
    """`best/best_checkpoint.json` of a run with `--save-best` (step, metric, value)."""

    def validation_rows(self) -> list[dict]:
        """The rows of validated steps (they carry `val_loss`)."""
        return [row for row in self.rows if _number(row.get("val_loss"))]

    def best_validation(self) -> tuple[int, float] | None:
        """(step, val_loss) of the best validation: best/'s step when the run kept one, else
        the best row by the run's --best-metric (training/validation.py's direction)."""
        rows = self.validation_rows()
        if not rows:
            return None
        by_step = {row["step"]: row for row in rows}
        step = (self.best or {}).get("step")
        if step in by_step:
            return step, by_step[step]["val_loss"]
        metric = (self.args or {}).get("best_metric") or "val_loss"
        if metric not in VAL_METRICS:
            metric = "val_loss"
        scored = [row for row in rows if _number(row.get(metric))]
        if not scored:
            return None
        pick = min if VAL_METRICS[metric] == "min" else max
        row = pick(scored, key=lambda r: r[metric])  # the first of equal values, as in training
        return row["step"], row["val_loss"]


@dataclass(frozen=True)
class Curve:
    """One run's line in a panel of the training plots (a panel per method)."""

    legend: str
    run: RunData
    stage: int | None = None
    """Its colour: one per stage within a panel (None: one per line)."""
    lr: float | None = None
    """Its line style: one per learning rate within a panel."""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def lr_label(lr: float | None) -> str:
    return "lr ?" if lr is None else f"lr {lr:g}"


def _resolve(raw: str, manifest_dir: Path) -> Path:
    """Relative paths are taken from the working directory, else from the manifest's folder."""
    path = Path(raw)
    if path.is_absolute() or path.exists():
        return path
    beside = manifest_dir / path
    return beside if beside.exists() else path


def load_manifest(path: Path) -> Manifest:
    """Parse and check MANIFEST.json; `UserError` naming each bad field."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: --manifest: no such file") from None
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: not valid JSON ({error})") from None
    problems = []
    tasks = raw.get("tasks") if isinstance(raw, dict) else None
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        problems.append(f"{path}: tasks: expected a non-empty list of task names")
        tasks = []
    elif len(set(tasks)) != len(tasks):
        problems.append(f"{path}: tasks: names repeat")
    items = raw.get("entries") if isinstance(raw, dict) else None
    if not isinstance(items, list):
        problems.append(f"{path}: entries: expected a list")
        items = []
    entries = []
    for i, item in enumerate(items):
        where = f"{path}: entries[{i}]"
        entry, entry_problems = _entry(item, where, tasks, path.parent)
        problems += entry_problems
        if entry is not None:
            entries.append(entry)
    if problems:
        raise UserError(*problems)
    return Manifest(tasks=tasks, entries=entries)


def _entry(item, where: str, tasks: list[str], manifest_dir: Path):
    if not isinstance(item, dict):
        return None, [f"{where}: expected an object"]
    problems = []
    kind = item.get("kind")
    if kind not in KINDS:
        problems.append(f"{where}.kind: {kind!r} is not one of {', '.join(KINDS)}")
    if not isinstance(item.get("path"), str) or not item["path"]:
        problems.append(f"{where}.path: expected a file or folder path")
    method, lr, stage, task = (item.get(k) for k in ("method", "lr", "stage", "task"))
    if method is not None and not isinstance(method, str):
        problems.append(f"{where}.method: expected a name or null")
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float))):
        problems.append(f"{where}.lr: expected a number or null")
    if kind in ("eval", "run"):
        if isinstance(stage, bool) or not isinstance(stage, int) or stage < 0:
            problems.append(f"{where}.stage: expected an integer >= 0")
        elif stage > len(tasks):
            problems.append(f"{where}.stage: {stage} but there are only {len(tasks)} tasks")
        elif stage == 0 and method is not None:
            problems.append(f"{where}.method: stage 0 is the base model, its method is null")
        elif stage > 0 and method is None:
            problems.append(f"{where}.method: stage {stage} needs the method it was trained with")
    if kind in ("eval", "data_summary") and task not in tasks:
        problems.append(f"{where}.task: {task!r} is not one of the manifest's tasks")
    if problems:
        return None, problems
    entry = Entry(
        kind=kind,
        path=_resolve(item["path"], manifest_dir),
        method=method,
        lr=float(lr) if lr is not None else None,
        stage=stage,
        task=task,
    )
    return entry, []


def read_json_file(path: Path) -> tuple[dict | None, str | None]:
    """(content, None), or (None, why not): missing, unreadable, not a JSON object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, "no such file"
    except (OSError, ValueError) as error:
        return None, f"unreadable ({error})"
    if not isinstance(data, dict):
        return None, "not a JSON object"
    return data, None


def read_eval(path: Path) -> EvalResult:
    data, problem = read_json_file(path)
    result = EvalResult(path=path, data=data, problem=problem)
    if problem is None and result.accuracy is None:
        result.problem = "no token_accuracy in it"
    return result


def read_run(path: Path, label: str | None = None) -> RunData:
    """Metrics rows (a torn last line is skipped) and training_args.json of a run folder."""
    run = RunData(path=path, label=label or path.name)
    metrics = path / "metrics.jsonl"
    try:
        lines = metrics.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        run.problem = f"{metrics}: no such file"
        lines = []
    except OSError as error:
        run.problem = f"{metrics}: unreadable ({error})"
        lines = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            run.rows.append(row)
    run.args, _ = read_json_file(path / "training_args.json")
    run.best, _ = read_json_file(path / "best" / "best_checkpoint.json")
    return run
