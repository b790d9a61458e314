"""The report manifest: which file is which cell of the experiment (its format: docs/evaluate.md,
"mini-trainer report"). This module owns the format: it writes it and reads it.

The pipeline knows every file's place (method, learning rate, stage, task) from its config;
`mini-trainer manifest` writes that down so `mini-trainer report` never has to guess it from
paths. Paths are written as given (relative to the pipeline's working folder). The manifest does
not check that the files exist: a missing file is a missing cell in the report, never invented.
Reading (`load_manifest`), a malformed manifest is the user's mistake and stops the report
(`UserError`, one line per problem).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from mini_trainer.data.outputs import check_writable
from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_write_text

BASE_MARK = "-"
"""Method and learning rate of the base model's entries on the command line (JSON null)."""

KINDS = ("eval", "run", "data_summary", "benchmark", "score")
"""The kinds of entry, each written by one `to_json` (or `build_manifest`) and read by `_entry`."""


# Kept alike on purpose: typed fields with a docstring each (as report/inputs.py's Curve).
@dataclass(frozen=True)
class Entry:
    """One manifest entry as read (`load_manifest`), its path resolved."""

    kind: str
    """One of `KINDS`."""
    path: Path
    """The file or folder, relative paths resolved (`_resolve`)."""
    method: str | None = None
    """The training method; None for the base model and for data summaries."""
    lr: float | None = None
    """The learning rate; None where `method` is."""
    stage: int | None = None
    """0 for the base model, i for the model after stage i (a benchmark: the job's stage); None
    for data summaries."""
    task: str | None = None
    """The evaluated task (eval) or the summarised one (data_summary); None for a run."""


@dataclass
class Manifest:
    """A read manifest: the stage tasks in order, the entries, and what each method is."""

    tasks: list[str]
    entries: list[Entry]
    methods: dict[str, dict] = field(default_factory=dict)
    """Method name -> `{"label", "method", "settings", "bound"}` (`METHOD_INFO_FIELDS`); empty in
    a manifest written before methods were described (the report then shows the names alone)."""


METHOD_INFO_FIELDS = {"label": str, "method": str, "settings": dict, "bound": bool}
"""A method's description in the manifest: its report label, the registered training method it
runs, its settings as configured (what differs from the shared options), and whether it is the
multi-task bound (drawn as a reference, not as a series)."""


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


def parse_eval(fields: tuple[str, str, str, str, str], flag: str = "--eval") -> EvalEntry:
    """`PATH METHOD LR STAGE TASK`; METHOD and LR are `-` for the base model (stage 0). With
    `flag` `--score`: a `trace-score` JSON of that cell instead of an evaluate JSON."""
    path, method, lr, stage, task = fields
    where = f"{flag} {' '.join(fields)}"
    stage_number = _stage(stage, where)
    if method == BASE_MARK or lr == BASE_MARK:
        if (method, lr, stage_number) != (BASE_MARK, BASE_MARK, 0):
            raise UserError(f"{where}: the base model is METHOD - LR - STAGE 0")
        return EvalEntry(path, None, None, 0, task)
    if stage_number < 1:
        raise UserError(f"{where}: STAGE of a trained checkpoint starts at 1")
    return EvalEntry(path, method, _lr(lr, where), stage_number, task)


def parse_run(fields: tuple[str, str, str, str], flag: str = "--run") -> RunEntry:
    """`PATH METHOD LR STAGE` of a training output folder (or, with `flag` `--benchmark`, of the
    Snakemake benchmark file of a job done for that cell)."""
    path, method, lr, stage = fields
    where = f"{flag} {' '.join(fields)}"
    stage_number = _stage(stage, where)
    if stage_number < 1:
        raise UserError(f"{where}: STAGE starts at 1")
    return RunEntry(path, method, _lr(lr, where), stage_number)


def parse_method_info(fields: tuple[str, str]) -> tuple[str, dict]:
    """`NAME JSON`: a method's description (`METHOD_INFO_FIELDS`)."""
    name, text = fields
    where = f"--method-info {name}"
    try:
        info = json.loads(text)
    except ValueError as error:
        raise UserError(f"{where}: not JSON ({error})") from None
    problems = _method_info_problems(info, where)
    if problems:
        raise UserError(*problems)
    return name, info


def _method_info_problems(info, where: str) -> list[str]:
    if not isinstance(info, dict):
        return [f"{where}: expected an object with {', '.join(METHOD_INFO_FIELDS)}"]
    problems = []
    for key, kind in METHOD_INFO_FIELDS.items():
        if not isinstance(info.get(key), kind):
            problems.append(f"{where}.{key}: expected a {kind.__name__}")
    unknown = sorted(set(info) - set(METHOD_INFO_FIELDS))
    if unknown:
        problems.append(f"{where}: unknown field(s) {', '.join(unknown)}")
    return problems


def build_manifest(
    tasks: list[str],
    evals: list[EvalEntry],
    runs: list[RunEntry],
    data_summaries: list[tuple[str, str]],
    benchmarks: list[RunEntry] = (),
    methods: dict[str, dict] | None = None,
    scores: list[EvalEntry] = (),
) -> dict:
    """The manifest as a JSON-ready dict; refuses what would make the report ambiguous.

    `benchmarks`: the Snakemake benchmark files of the jobs done for a (method, lr, stage) cell
    (its training, its EWC Fisher...), the report's wall time per method; `methods`: each
    method's description (`parse_method_info`); `scores`: TRACE score JSONs, cells as evals."""
    if not tasks:
        raise UserError("--task: give the stage tasks in order (at least one)")
    if len(set(tasks)) != len(tasks):
        raise UserError(f"--task: a task is given twice: {', '.join(tasks)}")
    for flag, entries in (("--eval", evals), ("--score", scores)):
        for entry in entries:
            if entry.task not in tasks:
                raise UserError(f"{flag} {entry.path}: task {entry.task!r} is not a --task")
    for entry in [*evals, *runs, *benchmarks, *scores]:
        if entry.stage > len(tasks):
            raise UserError(f"{entry.path}: stage {entry.stage} but only {len(tasks)} tasks")
    cells = [(e.method, e.lr, e.stage, e.task) for e in evals]
    _refuse_duplicates("--eval", cells)
    _refuse_duplicates("--score", [(e.method, e.lr, e.stage, e.task) for e in scores])
    _refuse_duplicates("--run", [(r.method, r.lr, r.stage) for r in runs])
    entries = [e.to_json() for e in evals] + [r.to_json() for r in runs]
    entries += [
        {"kind": "data_summary", "path": path, "task": task} for path, task in data_summaries
    ]
    entries += [{**b.to_json(), "kind": "benchmark"} for b in benchmarks]
    entries += [{**e.to_json(), "kind": "score"} for e in scores]
    manifest = {"tasks": list(tasks), "entries": entries}
    if methods:
        manifest["methods"] = dict(methods)
    return manifest


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


# ---------------------------------------------------------------------------- reading


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
    methods = raw.get("methods", {}) if isinstance(raw, dict) else {}
    if not isinstance(methods, dict):
        problems.append(f"{path}: methods: expected an object (method name -> description)")
        methods = {}
    for name, info in methods.items():
        problems += _method_info_problems(info, f"{path}: methods.{name}")
    if problems:
        raise UserError(*problems)
    return Manifest(tasks=tasks, entries=entries, methods=methods)


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
    if kind == "benchmark" and (method is None or lr is None):
        problems.append(f"{where}: a benchmark names the method and lr of its job")
    if kind in ("eval", "run", "benchmark", "score"):
        if isinstance(stage, bool) or not isinstance(stage, int) or stage < 0:
            problems.append(f"{where}.stage: expected an integer >= 0")
        elif stage > len(tasks):
            problems.append(f"{where}.stage: {stage} but there are only {len(tasks)} tasks")
        elif stage == 0 and method is not None:
            problems.append(f"{where}.method: stage 0 is the base model, its method is null")
        elif stage > 0 and method is None:
            problems.append(f"{where}.method: stage {stage} needs the method it was trained with")
    if kind in ("eval", "data_summary", "score") and task not in tasks:
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
