"""What the report reads: training run folders, evaluate JSONs, data summaries (the manifest
that says which is which is read by `mini_trainer/manifest.py`, which also writes it).

A file the manifest points to that is missing or unreadable is a fact about the experiment (a
failed or unfinished job): it is recorded with its reason and shown as missing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from mini_trainer.validation_options import VAL_METRICS


@dataclass
class EvalResult:
    """An evaluate JSON (or a `trace-score` JSON), or why it could not be used (`problem`)."""

    path: Path
    data: dict | None
    problem: str | None = None
    field: str = "token_accuracy"
    """The number this file gives a matrix cell: `token_accuracy`, or a TRACE `score`."""

    @property
    def accuracy(self) -> float | None:
        value = (self.data or {}).get(self.field)
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


def read_eval(path: Path, field: str = "token_accuracy") -> EvalResult:
    data, problem = read_json_file(path)
    result = EvalResult(path=path, data=data, problem=problem, field=field)
    if problem is None and result.accuracy is None:
        result.problem = f"no {field} in it"
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


def read_benchmark(path: Path) -> tuple[float | None, str | None]:
    """(wall seconds, None) of a Snakemake benchmark TSV (its `s` column, the first row), or
    (None, why not): missing, unreadable, no `s` column or no number in it."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None, "no such file"
    except (OSError, UnicodeDecodeError) as error:
        return None, f"unreadable ({error})"
    if len(lines) < 2 or "s" not in lines[0].split("\t"):
        return None, "not a benchmark file (no `s` column and row)"
    value = lines[1].split("\t")[lines[0].split("\t").index("s")]
    try:
        seconds = float(value)
    except ValueError:
        return None, f"`s` is {value!r}, not a number"
    return (seconds, None) if math.isfinite(seconds) and seconds >= 0 else (None, f"`s` is {value}")
