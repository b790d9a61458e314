"""The report's sections, in page order; each returns (anchor, heading, inner HTML).

Plots are written into the given folder under fixed names that the HTML refers to.
"""

from __future__ import annotations

from pathlib import Path

from mini_trainer.models.hub import hub_source
from mini_trainer.report import html as h
from mini_trainer.report import metrics
from mini_trainer.report.inputs import EvalResult, RunData, lr_label
from mini_trainer.versions import machine, package_versions, source_commit


def summary_section(groups) -> tuple[str, str, str]:
    rows = []
    for g in groups:
        matrix = g.matrix
        point = metrics.frontier_point(matrix) if g.last_stage >= 2 else None
        rows.append([
            h.text(g.method), h.text(f"{g.lr:g}" if g.lr is not None else "?"),
            h.num(g.last_stage, "{:d}"),
            h.pct(metrics.average_accuracy(matrix)) if g.last_stage >= 1 else h.MISSING,
            h.pct(metrics.backward_transfer(matrix), signed=True) if g.last_stage >= 2
            else '<td class="num">n/a (one stage)</td>',
            h.pct(point[0] if point else None), h.pct(point[1] if point else None),
        ])  # fmt: skip
    intro = (
        "<p>After the last stage T of each method and learning rate: <b>AA</b> is the mean "
        "token accuracy over the T tasks seen so far; <b>BWT</b> is the mean, over the earlier "
        "tasks, of (accuracy after stage T &minus; accuracy right after that task was learned): "
        "negative means forgetting. Both as in the OSFT paper (arXiv:2504.07097). A cell that "
        "needs a missing evaluation says <i>missing</i>.</p>"
    )
    headers = ["method", "learning rate", "last stage", "AA", "BWT", "newest task",
               "retained (earlier tasks)"]  # fmt: skip
    body = h.table(headers, rows) if rows else "<p>No method in the manifest.</p>"
    return "summary", "Average accuracy (AA) and backward transfer (BWT)", intro + body


def frontier_section(groups, folder: Path, plots, note: str) -> tuple[str, str, str]:
    series: dict[str, list[tuple[float, float, str]]] = {}
    skipped = []
    for g in groups:
        matrix = g.matrix
        point = metrics.frontier_point(matrix) if g.last_stage >= 2 else None
        if point is None:
            skipped.append(g.name)
            continue
        series.setdefault(g.method, []).append((point[0], point[1], lr_label(g.lr)))
    front = {m: metrics.pareto_front([(x, y) for x, y, _ in pts]) for m, pts in series.items()}
    plots.plot_frontier(series, folder / "frontier.png", front)
    extra = ""
    if skipped:
        extra = (
            f'<p class="problems">Not on the plot (a needed evaluation is missing, or fewer '
            f"than two stages): {h.esc(', '.join(skipped))}.</p>"
        )
    inner = (
        f'<div class="side">{h.image("frontier.png", "retention vs learning frontier")}'
        f"<aside><b>How to read it.</b> {h.esc(note)} Filled points are on the method's "
        "Pareto front (no other learning rate of the method is better on both axes).</aside>"
        f"</div>{extra}"
    )
    return "frontier", "Frontier: retained accuracy vs. newest-task accuracy", inner


def matrices_section(groups, tasks, folder: Path, plots) -> tuple[str, str, str]:
    parts = [
        "<p>Teacher-forced answer-token accuracy (<code>mini-trainer evaluate</code>'s "
        "<code>token_accuracy</code>) after each stage (rows; row 0 is the base model) on "
        "each task's eval set (columns).</p>"
    ]
    cells = []
    for g in groups:
        name = f"matrix_{g.slug}.png"
        plots.plot_matrix(g.matrix, tasks, f"{g.name}: accuracy matrix", folder / name)
        cell = f"<div><h3>{h.esc(g.name)}</h3>{h.image(name, f'accuracy matrix, {g.name}')}"
        if g.missing:
            items = "".join(f"<li>{h.esc(m)}</li>" for m in g.missing)
            cell += f'<p class="problems">Missing evaluations:</p><ul class="problems">{items}</ul>'
        cells.append(cell + "</div>")
    parts.append(f'<div class="grid">{"".join(cells)}</div>')
    return "matrices", "Accuracy matrices", "".join(parts)


def training_section(runs: list[RunData], folder: Path, plots) -> tuple[str, str, str]:
    if not runs:
        return "training", "Training", "<p>No training run given.</p>"
    with_rows = [r for r in runs if r.rows]
    parts = []
    if with_rows:
        plots.plot_training(with_rows, folder / "training_loss_lr.png")
        plots.plot_throughput(with_rows, folder / "throughput.png")
        parts += [h.image("training_loss_lr.png", "loss and learning rate against step"),
                  h.image("throughput.png", "tokens per second against step")]  # fmt: skip
    rows = []
    for r in runs:
        last = r.rows[-1] if r.rows else {}
        speeds = [row["tokens_per_second"] for row in r.rows if "tokens_per_second" in row]
        speed = sorted(speeds)[len(speeds) // 2] if speeds else None
        best = r.best_validation()  # no validation: empty cells, not "missing"
        best_cells = [h.num(best[1]), h.num(best[0], "{:d}")] if best else [h.text("")] * 2
        rows.append([
            h.text(r.label), h.num(last.get("step"), "{:d}"), h.num(last.get("loss")),
            *best_cells,
            h.num(speed, "{:,.0f}"), h.num(last.get("peak_memory_gb"), "{:.2f}"),
            h.text(str(r.path)), h.text(r.problem or ""),
        ])  # fmt: skip
    headers = ["run", "steps", "final loss", "best val loss", "best step", "median tokens/s",
               "peak memory (GiB)", "folder", "problem"]  # fmt: skip
    parts.append(h.table(headers, rows))
    return "training", "Training", "".join(parts)


def evals_section(evals: dict[tuple, EvalResult], extra: list[EvalResult]) -> tuple[str, str, str]:
    rows = []
    labelled = [(k, v) for k, v in evals.items()] + [((None, None, None, None), e) for e in extra]
    for (method, lr, stage, task), e in labelled:
        d = e.data or {}
        who = "base model" if stage == 0 else (f"{method} {lr_label(lr)}" if method else "")
        rows.append([
            h.text(who), h.text(stage if stage is not None else ""), h.text(task or ""),
            h.num(d.get("loss")), h.num(d.get("perplexity"), "{:.3f}"),
            h.pct(e.accuracy), h.pct(d.get("exact_match")),
            h.num(d.get("num_samples"), "{:,}"), h.text(str(e.path)),
            h.text(e.problem or ""),
        ])  # fmt: skip
    if not rows:
        return "evals", "Evaluations", "<p>No evaluation given.</p>"
    headers = ["model", "stage", "task", "loss", "perplexity", "token accuracy", "exact match",
               "samples", "file", "problem"]  # fmt: skip
    return "evals", "Evaluations", h.table(headers, rows)


def data_section(summaries) -> tuple[str, str, str]:
    rows = []
    for task, path, data, problem in summaries:
        d = data or {}
        length = d.get("length") or {}
        rows.append([
            h.text(task), h.num(d.get("samples"), "{:,}"), h.num(d.get("dropped"), "{:,}"),
            h.num(d.get("tokens"), "{:,}"), h.num(d.get("loss_tokens"), "{:,}"),
            h.num(length.get("p50"), "{:d}"), h.num(length.get("p99"), "{:d}"),
            h.num(length.get("max"), "{:d}"), h.text(str(path)), h.text(problem or ""),
        ])  # fmt: skip
    if not rows:
        return "data", "Data", "<p>No data summary in the manifest.</p>"
    headers = ["task", "samples", "dropped", "tokens", "loss tokens", "p50 length",
               "p99 length", "max length", "summary file", "problem"]  # fmt: skip
    return "data", "Data (from mini-trainer validate)", h.table(headers, rows)


def provenance_section(runs, evals, extra) -> tuple[str, str, str]:
    parts = ["<h3>This report</h3>"]
    here = {"git commit": source_commit() or "not a git checkout", **machine()}
    parts.append(h.table(["what", "value"], [[h.text(k), h.text(v)] for k, v in here.items()]))
    parts += _base_models(runs, evals, extra)
    versions = package_versions()
    seen = {}
    for e in [*evals.values(), *extra]:
        for name, version in ((e.data or {}).get("versions") or {}).items():
            seen.setdefault(name, set()).add(str(version))
    rows = [[h.text(name), h.text(versions.get(name) or "not installed"),
             h.text(", ".join(sorted(seen.get(name, []))) or "")] for name in versions]  # fmt: skip
    parts.append("<h3>Package versions</h3>")
    parts.append(h.table(["package", "where the report ran", "in the evaluate JSONs"], rows))
    parts.append("<h3>Resolved arguments of every run</h3>")
    with_args = [r for r in runs if r.args]
    if with_args:
        keys = sorted({k for r in with_args for k in r.args})
        differing = [k for k in keys if len({repr(r.args.get(k)) for r in with_args}) > 1]
        common = {k: with_args[0].args.get(k) for k in keys if k not in differing}
        if differing:
            # An argument that is None (unset) is a value here, not a missing number.
            rows = [[h.text(r.label)] + [h.text(_arg_value(r.args, k)) for k in differing]
                    for r in with_args]  # fmt: skip
            parts.append("<p>Arguments that differ between runs:</p>")
            parts.append(h.table(["run", *differing], rows))
        parts.append(h.json_details("Arguments shared by every run", common))
        parts += [h.json_details(f"{r.label}: training_args.json", r.args) for r in with_args]
    missing = [r.label for r in runs if not r.args]
    if missing:
        parts.append(f'<p class="problems">No training_args.json: {h.esc(", ".join(missing))}</p>')
    if not runs:
        parts.append("<p>No training run given.</p>")
    return "provenance", "Provenance", "".join(parts)


def _base_models(runs, evals, extra) -> list[str]:
    """Which Hub model and commit each run started from and each evaluation scored (if any)."""
    rows = []
    for r in runs:
        source = hub_source((r.args or {}).get("model_name_or_path") or "")
        if source:
            rows.append([h.text(f"run {r.label}"), h.text(source["hub_id"]),
                         h.text(source["commit"])])  # fmt: skip
    for e in [*evals.values(), *extra]:
        data = e.data or {}
        if data.get("model_commit"):
            rows.append([h.text(f"evaluation {data.get('model', '')}"),
                         h.text(data.get("model_hub_id", "")),
                         h.text(data["model_commit"])])  # fmt: skip
    if not rows:
        return []
    return ["<h3>Hub models and their commits</h3>", h.table(["what", "model", "commit"], rows)]


def _arg_value(args: dict, key: str) -> str:
    """How one resolved argument reads in the table: `null` when unset, `(absent)` when the run's
    training_args.json predates the option."""
    if key not in args:
        return "(absent)"
    return "null" if args[key] is None else str(args[key])
