"""The report's methods: what each one is (its label and settings, from the manifest) and what it
cost (tokens trained and time, from its runs' metrics and its jobs' Snakemake benchmark files).

The cost of one frontier point is the cost of one (method, learning rate): every stage it
trained, and the jobs done for it (an EWC Fisher, a weight interpolation). A run two methods
share (replay's stage 1 is SFT's run) costs each of them, as each needs it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from mini_trainer.manifest import Manifest
from mini_trainer.report import html as h
from mini_trainer.report import metrics
from mini_trainer.report.inputs import Curve, lr_label, read_benchmark


@dataclass
class Cost:
    """What one (method, learning rate) took."""

    method: str
    lr: float | None
    runs: int = 0
    """Training runs (stages) it trained on."""
    tokens: int | None = 0
    """Tokens of every optimizer step of those runs (`num_tokens` summed); None when a run has no
    metrics or a step no `num_tokens`."""
    step_seconds: float | None = 0.0
    """Time in the optimizer steps (`step_time_s` summed); None as for `tokens`."""
    wall_seconds: float | None = 0.0
    """Wall time of its jobs (training, Fisher, interpolation) from their benchmark files; None
    when one is missing or unreadable."""
    jobs: int = 0
    """Benchmark files counted."""
    problems: list[str] = field(default_factory=list)


def costs(manifest: Manifest, panels: dict[str, list[Curve]]) -> list[Cost]:
    """One `Cost` per (method, lr) of the manifest's runs and benchmarks, in method order."""
    table: dict[tuple, Cost] = {}
    methods = {entry.method for entry in manifest.entries if entry.kind == "run"}
    for method, curves in panels.items():
        if method not in methods:
            continue  # runs given on the command line, outside the manifest
        for curve in curves:
            cost = table.setdefault((method, curve.lr), Cost(method, curve.lr))
            cost.runs += 1
            steps = curve.run.rows
            if not steps:
                cost.problems.append(f"{curve.run.path}: no metrics")
            for key, attr in (("num_tokens", "tokens"), ("step_time_s", "step_seconds")):
                values = [row.get(key) for row in steps]
                total = getattr(cost, attr)
                ok = steps and all(isinstance(v, (int, float)) for v in values)
                setattr(cost, attr, total + sum(values) if ok and total is not None else None)
    for entry in manifest.entries:
        if entry.kind != "benchmark":
            continue
        cost = table.setdefault((entry.method, entry.lr), Cost(entry.method, entry.lr))
        seconds, problem = read_benchmark(entry.path)
        cost.jobs += 1
        if problem:
            cost.problems.append(f"{entry.path}: {problem}")
        cost.wall_seconds = None if seconds is None or cost.wall_seconds is None else (
            cost.wall_seconds + seconds
        )  # fmt: skip
    return sorted(table.values(), key=lambda c: (c.method, c.lr if c.lr is not None else -1))


def methods_section(manifest: Manifest, panels: dict[str, list[Curve]]) -> tuple[str, str, str]:
    """The methods' labels and settings, then the cost of each (method, learning rate)."""
    parts = []
    if manifest.methods:
        rows = [[h.text(name), h.text(info["label"]), h.text(info["method"]),
                 h.text("multi-task bound (a reference line on the frontier)" if info["bound"]
                        else "series"),
                 h.text(_settings(info["settings"]))]
                for name, info in sorted(manifest.methods.items())]  # fmt: skip
        parts.append(h.table(["name", "label", "training method", "shown as", "settings"], rows))
    else:
        parts.append("<p>The manifest does not describe the methods (written by hand, or "
                     "before it did): their names alone are shown.</p>")  # fmt: skip
    all_costs = costs(manifest, panels)
    timed = any(entry.kind == "benchmark" for entry in manifest.entries)
    rows = []
    for c in all_costs:
        rows.append([
            h.text(c.method), h.text(lr_label(c.lr)), h.num(c.runs, "{:d}"),
            h.num(c.tokens, "{:,}"), h.num(c.step_seconds, "{:,.1f}"),
            *([h.num(c.wall_seconds, "{:,.1f}"), h.num(c.jobs, "{:d}")] if timed else []),
        ])  # fmt: skip
    parts.append(
        "<p>Cost of each point of the frontier: its runs' tokens (every optimizer step's "
        "<code>num_tokens</code>) and time in optimizer steps (<code>step_time_s</code>), "
        + ("and the wall time of every job done for it (training, EWC Fisher, interpolation; "
           "Snakemake's benchmark files, start-up included). " if timed else
           "(no job wall time: the manifest lists no benchmark file). ")
        + "A run two methods share costs each.</p>"
    )  # fmt: skip
    headers = ["method", "learning rate", "runs", "tokens trained", "step time (s)",
               *(["job wall time (s)", "jobs"] if timed else [])]  # fmt: skip
    parts.append(h.table(headers, rows) if rows else "<p>No run in the manifest.</p>")
    problems = [p for c in all_costs for p in c.problems]
    if problems:
        items = "".join(f"<li>{h.esc(p)}</li>" for p in problems)
        parts.append(f'<p class="problems">Missing costs:</p><ul class="problems">{items}</ul>')
    return "methods", "Methods: settings and cost", "".join(parts)


def _settings(settings: dict) -> str:
    """`key: value` pairs as configured, or "none" (the shared options alone)."""
    if not settings:
        return "none (the shared training options)"
    return "; ".join(f"{k}: {json.dumps(v)}" for k, v in sorted(settings.items()))


def trace_section(groups) -> tuple[str, str, str]:
    """TRACE's overall performance (OP: the mean score over the tasks seen after the last stage)
    and BWT per (method, lr), from the `trace-score` cells: the AA and BWT of `metrics` on the
    score matrix. Only when the manifest has score entries (config/trace.yaml)."""
    rows = []
    for g in groups:
        matrix = g.matrix
        rows.append([
            h.text(g.method), h.text(lr_label(g.lr)), h.num(g.last_stage, "{:d}"),
            h.pct(metrics.average_accuracy(matrix)) if g.last_stage >= 1 else h.MISSING,
            h.pct(metrics.backward_transfer(matrix), signed=True) if g.last_stage >= 2
            else '<td class="num">n/a (one stage)</td>',
            h.text("; ".join(m for m in g.missing) or ""),
        ])  # fmt: skip
    intro = (
        "<p>Scores of generated answers with each task's TRACE metric (accuracy, ROUGE-L, edit "
        "similarity, SARI; <code>mini-trainer trace-score</code>), on [0, 1]. <b>OP</b> "
        "(overall performance) is the mean score over the tasks seen after the last stage, "
        "<b>BWT</b> the mean change of each earlier task's score since it was learned, as in "
        "TRACE (arXiv:2310.06762).</p>"
    )
    headers = ["method", "learning rate", "last stage", "OP", "BWT", "missing scores"]
    return "trace", "TRACE: overall performance (OP) and BWT", intro + h.table(headers, rows)
