"""`mini-trainer report`: gather runs and evaluations, compute the metrics, write the page.

Reading (`inputs`), the numbers (`metrics`), the pictures (`plots`) and the HTML (`html`) are
separate; this module wires them in the order of the page. Everything is written into a
temporary folder first and moved into DIR at the end, `report.html` last, so a failed report
leaves no half page behind.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from mini_trainer.data.outputs import check_writable
from mini_trainer.errors import UserError
from mini_trainer.io_utils import publish_file
from mini_trainer.manifest import Entry, Manifest, load_manifest
from mini_trainer.report import html as h
from mini_trainer.report import metrics
from mini_trainer.report.inputs import (
    Curve,
    EvalResult,
    RunData,
    lr_label,
    read_eval,
    read_json_file,
    read_run,
)
from mini_trainer.report.methods import methods_section, trace_section
from mini_trainer.report.sections import (
    data_section,
    evals_section,
    frontier_section,
    matrices_section,
    provenance_section,
    slug,
    summary_section,
    training_section,
)

FRONTIER_NOTE = (
    "Why not compare methods at one shared learning rate? A method that takes smaller "
    "effective steps (OSFT updates only part of each weight matrix) forgets less at the same "
    "learning rate partly because it also learns less. The fair comparison is retained "
    "accuracy at matched accuracy on the newest task: each method's points, one per learning "
    "rate, trace its trade-off curve, and the curve that lies higher at the same newest-task "
    "accuracy retains more for equal learning."
)


@dataclass
class Group:
    """One (method, learning rate) line of the experiment."""

    method: str
    lr: float | None
    num_tasks: int
    last_stage: int = 0
    cells: dict[tuple[int, int], float | None] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    @property
    def matrix(self) -> list[list[float | None]]:
        return metrics.build_matrix(self.num_tasks, self.last_stage, self.cells)

    @property
    def name(self) -> str:
        return self.method if self.lr is None else f"{self.method}, lr {self.lr:g}"

    @property
    def slug(self) -> str:
        return slug(self.name.replace(", lr ", "_lr"))


def collect_groups(
    manifest: Manifest, kind: str = "eval", field: str = "token_accuracy"
) -> tuple[list[Group], dict[tuple, EvalResult]]:
    """Per (method, lr): the accuracy cells (the `kind` entries' `field`: evaluations' token
    accuracy, or TRACE scores), the last stage and the missing evaluations."""
    tasks = manifest.tasks
    evals: dict[tuple, EvalResult] = {}
    groups: dict[tuple[str, float | None], Group] = {}
    base: dict[int, EvalResult] = {}
    for entry in manifest.entries:
        if entry.kind not in (kind, "run"):
            continue  # data summaries, benchmarks and the other kind of cell
        if entry.method is not None:
            key = (entry.method, entry.lr)
            group = groups.setdefault(key, Group(entry.method, entry.lr, len(tasks)))
            group.last_stage = max(group.last_stage, entry.stage)
        if entry.kind == kind:
            result = read_eval(entry.path, field)
            evals[(entry.method, entry.lr, entry.stage, entry.task)] = result
            if entry.stage == 0:
                base[tasks.index(entry.task)] = result
    ordered = sorted(groups.values(), key=lambda g: (g.method, g.lr if g.lr is not None else -1))
    for group in ordered:
        for stage in range(group.last_stage + 1):
            for j, task in enumerate(tasks):
                if stage == 0:
                    result = base.get(j)
                else:
                    result = evals.get((group.method, group.lr, stage, task))
                group.cells[(stage, j)] = result.accuracy if result else None
                if result is None or result.accuracy is None:
                    why = f"{result.path}: {result.problem}" if result else "not in the manifest"
                    row = "base model" if stage == 0 else f"stage {stage}"
                    group.missing.append(f"{row} on {task}: {why}")
    return ordered, evals


def cell_name(entry: Entry) -> str:
    return f"{entry.method} {lr_label(entry.lr)} stage {entry.stage}"


def collect_runs(
    manifest: Manifest,
) -> tuple[list[RunData], dict[str, list[Curve]], list[str]]:
    """Each run folder once, and per method the curves of its panel in the training plots.

    Two methods can share a run folder (the pipeline trains replay's stage 1, which has nothing
    to replay yet, once, as SFT's stage 1 at that learning rate): it is one run, labelled with
    every cell it fills, drawn in each method's panel, and named in `shared` (one sentence per
    shared folder)."""
    cells: dict[Path, list[Entry]] = {}
    for entry in manifest.entries:
        if entry.kind == "run":
            cells.setdefault(entry.path, []).append(entry)
    runs, panels, shared = [], {}, []
    for path, entries in cells.items():
        first, *others = entries
        label = cell_name(first)
        if 1 <= first.stage <= len(manifest.tasks):
            label += f" ({manifest.tasks[first.stage - 1]})"
        if others:
            also = ", ".join(cell_name(e) for e in others)
            label += f"; also {also}"
            shared.append(f"{also} is the run of {cell_name(first)} ({path}): trained once")
        run = read_run(path, label)
        runs.append(run)
        for entry in entries:
            legend = f"{lr_label(entry.lr)}, stage {entry.stage}"
            if 1 <= entry.stage <= len(manifest.tasks):
                legend += f" ({manifest.tasks[entry.stage - 1]})"
            if entry is not first:
                legend += f": {first.method}'s run"
            curve = Curve(legend, run, entry.stage, entry.lr)
            panels.setdefault(entry.method or "base", []).append(curve)
    return runs, dict(sorted(panels.items())), shared  # methods in the order of the tables


def evals_by_file(evals: dict[tuple, EvalResult]) -> list[tuple[list[tuple], EvalResult]]:
    """Each evaluation file once, with every (method, lr, stage, task) cell it fills (a shared
    run's evaluations fill the cells of each method that shares it)."""
    files: dict[Path, tuple[list[tuple], EvalResult]] = {}
    for key, result in evals.items():
        files.setdefault(result.path, ([], result))[0].append(key)
    return list(files.values())


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def build_report(
    out_dir: Path, manifest_path: Path | None, inputs: list[Path], force: bool = False
) -> Path:
    """Write OUT_DIR/report.html and its PNGs; return the page's path."""
    # deferred: matplotlib (~1 s); the CLI imports this module for every command
    from mini_trainer.report import plots

    page_path = out_dir / "report.html"
    if page_path.exists() and not force:
        raise UserError(f"{page_path}: already exists (pass --force to replace it)")
    check_writable(out_dir, "--out")
    if manifest_path is None and not inputs:
        raise UserError("report: nothing to report: give --manifest and/or run folders/eval JSONs")
    manifest = load_manifest(manifest_path) if manifest_path else None
    runs, extra_evals = _positional(inputs)
    panels: dict[str, list[Curve]] = {"runs": [Curve(r.label, r) for r in runs]}
    groups: list[Group] = []
    evals: dict[tuple, EvalResult] = {}
    summaries = []
    shared: list[str] = []
    if manifest is not None:
        groups, evals = collect_groups(manifest)
        manifest_runs, panels, shared = collect_runs(manifest)
        runs = manifest_runs + runs
        if inputs:
            panels["other runs"] = [Curve(r.label, r) for r in runs[len(manifest_runs) :]]
        summaries = [(e.task, e.path, *read_json_file(e.path))
                     for e in manifest.entries if e.kind == "data_summary"]  # fmt: skip
    panels = {name: lines for name, lines in panels.items() if lines}
    tasks = manifest.tasks if manifest else []
    eval_files = evals_by_file(evals)
    unusable = sum(e.problem is not None for _, e in eval_files) + sum(
        e.problem is not None for e in extra_evals
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".report.tmp-", dir=out_dir))
    try:
        sections = []
        if manifest is not None:
            sections.append(summary_section(groups, shared))
            bounds = frozenset(n for n, info in manifest.methods.items() if info["bound"])
            sections.append(frontier_section(groups, tmp, plots, FRONTIER_NOTE, bounds))
            sections.append(matrices_section(groups, tasks, tmp, plots))
            sections.append(methods_section(manifest, panels))
            if any(entry.kind == "score" for entry in manifest.entries):
                sections.append(trace_section(collect_groups(manifest, "score", "score")[0]))
        sections.append(training_section(runs, panels, tmp, plots))
        sections.append(evals_section(eval_files, extra_evals))
        if manifest is not None:
            sections.append(data_section(summaries))
        sections.append(provenance_section(runs, evals, extra_evals))
        subtitle = (
            f"generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; "
            f"{_count(len(runs), 'training run')}, "
            f"{_count(len(eval_files) + len(extra_evals), 'evaluation file')}"
            + (f" ({unusable} missing or unreadable)" if unusable else "")
            + (f" ({len(shared)} run(s) shared by two methods, shown once)" if shared else "")
            + (f"; tasks in stage order: {', '.join(tasks)}" if tasks else "")
        )
        (tmp / "report.html").write_text(
            h.page("mini-trainer report", subtitle, sections), encoding="utf-8"
        )
        names = sorted(p.name for p in tmp.iterdir())
        for name in [n for n in names if n != "report.html"] + ["report.html"]:
            publish_file(tmp / name, out_dir / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return page_path


def _positional(inputs: list[Path]) -> tuple[list[RunData], list[EvalResult]]:
    runs, evals = [], []
    for path in inputs:
        if path.is_dir():
            runs.append(read_run(path, str(path)))
        elif path.is_file():
            evals.append(read_eval(path))
        else:
            raise UserError(f"{path}: INPUT: no such run folder or evaluate JSON")
    return runs, evals
