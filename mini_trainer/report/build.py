"""`mini-trainer report`: gather runs and evaluations, compute the metrics, write the page.

Reading (`inputs`), the numbers (`metrics`), the pictures (`plots`) and the HTML (`html`) are
separate; this module wires them in the order of the page. Everything is written into a
temporary folder first and moved into DIR at the end, `report.html` last, so a failed report
leaves no half page behind.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from mini_trainer.data.outputs import check_writable
from mini_trainer.errors import UserError
from mini_trainer.io_utils import publish_file
from mini_trainer.report import html as h
from mini_trainer.report import metrics
from mini_trainer.report.inputs import (
    EvalResult,
    Manifest,
    RunData,
    load_manifest,
    lr_label,
    read_eval,
    read_json_file,
    read_run,
)
from mini_trainer.report.sections import (
    data_section,
    evals_section,
    frontier_section,
    matrices_section,
    provenance_section,
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
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.name.replace(", lr ", "_lr"))


def collect_groups(manifest: Manifest) -> tuple[list[Group], dict[tuple, EvalResult]]:
    """Per (method, lr): the accuracy cells, the last stage and the missing evaluations."""
    tasks = manifest.tasks
    evals: dict[tuple, EvalResult] = {}
    groups: dict[tuple[str, float | None], Group] = {}
    base: dict[int, EvalResult] = {}
    for entry in manifest.entries:
        if entry.kind not in ("eval", "run"):
            continue
        if entry.method is not None:
            key = (entry.method, entry.lr)
            group = groups.setdefault(key, Group(entry.method, entry.lr, len(tasks)))
            group.last_stage = max(group.last_stage, entry.stage)
        if entry.kind == "eval":
            result = read_eval(entry.path)
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
    groups: list[Group] = []
    evals: dict[tuple, EvalResult] = {}
    summaries = []
    if manifest is not None:
        groups, evals = collect_groups(manifest)
        for entry in manifest.entries:
            if entry.kind == "run":
                label = f"{entry.method} {lr_label(entry.lr)} stage {entry.stage}"
                if 1 <= entry.stage <= len(manifest.tasks):
                    label += f" ({manifest.tasks[entry.stage - 1]})"
                runs.append(read_run(entry.path, label))
            elif entry.kind == "data_summary":
                summaries.append((entry.task, entry.path, *read_json_file(entry.path)))
    tasks = manifest.tasks if manifest else []

    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".report.tmp-", dir=out_dir))
    try:
        sections = []
        if manifest is not None:
            sections.append(summary_section(groups))
            sections.append(frontier_section(groups, tmp, plots, FRONTIER_NOTE))
            sections.append(matrices_section(groups, tasks, tmp, plots))
        sections.append(training_section(runs, tmp, plots))
        sections.append(evals_section(evals, extra_evals))
        if manifest is not None:
            sections.append(data_section(summaries))
        sections.append(provenance_section(runs, evals, extra_evals))
        subtitle = (
            f"generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; "
            f"{len(runs)} training run(s), {len(evals) + len(extra_evals)} evaluation(s)"
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
