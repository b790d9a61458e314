"""The report's sections, in page order; each returns (anchor, heading, inner HTML).

Plots are written into the given folder under fixed names that the HTML refers to.
"""

from __future__ import annotations

import re
from pathlib import Path

from mini_trainer.data.mix import sidecar_beside
from mini_trainer.models.hub import hub_source
from mini_trainer.report import html as h
from mini_trainer.report import metrics
from mini_trainer.report.inputs import Curve, EvalResult, RunData, lr_label, read_json_file
from mini_trainer.versions import machine, package_versions, source_commit


def summary_section(groups, shared: list[str] = ()) -> tuple[str, str, str]:
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
    if shared:
        body += (
            "<p>Shared runs (same options, same data, same starting model; trained and "
            "evaluated once, counted once):</p><ul>"
            + "".join(f"<li>{h.esc(line)}</li>" for line in shared)
            + "</ul>"
        )
    return "summary", "Average accuracy (AA) and backward transfer (BWT)", intro + body


def frontier_section(
    groups, folder: Path, plots, note: str, bounds: frozenset[str] = frozenset()
) -> tuple[str, str, str]:
    """One series per method, one point per learning rate; a method in `bounds` (the multi-task
    bound) is no series: its best learning rate (highest AA) is drawn as reference lines."""
    series: dict[str, list[tuple[float, float, str]]] = {}
    skipped = []
    references = []
    for g in groups:
        matrix = g.matrix
        point = metrics.frontier_point(matrix) if g.last_stage >= 2 else None
        if point is None:
            skipped.append(g.name)
        elif g.method in bounds:
            references.append((metrics.average_accuracy(matrix) or 0.0, g, point))
        else:
            series.setdefault(g.method, []).append((point[0], point[1], lr_label(g.lr)))
    reference = None
    if references:
        _, best, (newest, retained) = max(references, key=lambda r: r[0])
        reference = (f"{best.method} (multi-task bound, {lr_label(best.lr)})", newest, retained)
    front = {m: metrics.pareto_front([(x, y) for x, y, _ in pts]) for m, pts in series.items()}
    plots.plot_frontier(series, folder / "frontier.png", front, reference)
    extra = ""
    if reference:
        extra += (
            f"<p>The multi-task bound ({h.esc(reference[0])}: one training on every task's "
            f"data) is drawn as reference lines, not as a series: {reference[2]:.1%} retained, "
            f"{reference[1]:.1%} on the newest task (its best learning rate by AA).</p>"
        )
    if skipped:
        extra += (
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


def slug(name: str) -> str:
    """A file-name-safe form of a name (a method, a method and its learning rate)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def training_section(
    runs: list[RunData], panels: dict[str, list[Curve]], folder: Path, plots
) -> tuple[str, str, str]:
    """Each run once in the table; the curves in one panel per method (a run two methods share
    is in both panels)."""
    if not runs:
        return "training", "Training", "<p>No training run given.</p>"
    drawn = {name: [c for c in curves if c.run.rows] for name, curves in panels.items()}
    drawn = {name: lines for name, lines in drawn.items() if lines}
    parts = []
    if drawn:
        parts.append(
            "<p>Loss and learning rate of each method's runs (a panel per method: a colour per "
            "stage, a line style per learning rate; a run two methods share is drawn in "
            "both), then throughput.</p>"
        )
        for name, curves in drawn.items():
            image = f"training_{slug(name)}.png"
            plots.plot_training(name, curves, folder / image)
            parts.append(f'<div class="curves"><h3>{h.esc(name)}</h3>'
                         f"{h.image(image, f'loss and learning rate, {name}')}</div>")  # fmt: skip
        plots.plot_throughput(drawn, folder / "throughput.png")
        parts.append(h.image("throughput.png", "tokens per second, per method"))
    validated = any(r.validation_rows() for r in runs)
    rows = []
    for r in runs:
        last = r.rows[-1] if r.rows else {}
        speeds = [row["tokens_per_second"] for row in r.rows if "tokens_per_second" in row]
        speed = sorted(speeds)[len(speeds) // 2] if speeds else None
        best = r.best_validation()
        best_cells = [h.num(best[1]), h.num(best[0], "{:d}")] if best else [h.text("none")] * 2
        rows.append([
            h.text(r.label), h.num(last.get("step"), "{:d}"), h.num(last.get("loss")),
            *(best_cells if validated else []),
            h.num(speed, "{:,.0f}"), h.num(last.get("peak_memory_gb"), "{:.2f}"),
            h.text(str(r.path)), h.text(r.problem or ""),
        ])  # fmt: skip
    headers = ["run", "steps", "final loss",
               *(["best val loss", "best step"] if validated else []),
               "median tokens/s", "peak memory (GiB)", "folder", "problem"]  # fmt: skip
    parts.append(h.table(headers, rows))
    if not validated:
        parts.append(
            "<p>No run scored a validation set (<code>--validation-data-path</code>), so there "
            "is no validation loss or best step to show.</p>"
        )
    return "training", "Training", "".join(parts)


def evals_section(files, extra: list[EvalResult]) -> tuple[str, str, str]:
    """One row per evaluation file; `files` holds (cells, result) with every (method, lr,
    stage, task) cell the file fills (a shared run's file fills two methods' cells)."""
    rows = []
    labelled = [*files, *(([(None, None, None, None)], e) for e in extra)]
    for cells, e in labelled:
        d = e.data or {}
        method, lr, stage, task = cells[0]
        who = "; ".join(dict.fromkeys(
            "base model" if s == 0 else (f"{m} {lr_label(r)}" if m else "")
            for m, r, s, _ in cells
        ))  # fmt: skip
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
    """One row per training file: each task's, and each mixture a stage trains on (a stage
    mixture, or replay), with what the mixture holds (its `mix` sidecar)."""
    rows = []
    for task, path, data, problem in summaries:
        d = data or {}
        length = d.get("length") or {}
        data_file = d.get("data_file") or ""
        rows.append([
            h.text(task), h.text(data_file), h.text(mixture_contents(data_file)),
            h.num(d.get("samples"), "{:,}"), h.num(d.get("dropped"), "{:,}"),
            h.num(d.get("tokens"), "{:,}"), h.num(d.get("loss_tokens"), "{:,}"),
            h.num(length.get("p50"), "{:d}"), h.num(length.get("p99"), "{:d}"),
            h.num(length.get("max"), "{:d}"), h.text(str(path)), h.text(problem or ""),
        ])  # fmt: skip
    if not rows:
        return "data", "Data", "<p>No data summary in the manifest.</p>"
    headers = ["stage's task", "training file", "contents", "samples", "dropped", "tokens",
               "loss tokens", "p50 length", "p99 length", "max length", "summary file",
               "problem"]  # fmt: skip
    return "data", "Data (from mini-trainer validate)", h.table(headers, rows)


def mixture_contents(data_file: str) -> str:
    """What a mixture holds, from the `mix` sidecar beside it ("mixture: 2,000 of 2,000 from
    sort_desc.train.jsonl + 500 of 2,000 replayed from sort.train.jsonl"); "" for a file
    without one (a task's own file)."""
    if not data_file:
        return ""
    record, problem = read_json_file(sidecar_beside(data_file))
    if problem == "no such file":
        return ""
    if record is None or not isinstance(record.get("inputs"), list):
        return f"a mixture whose sidecar is unreadable ({problem or 'no inputs'})"
    parts = []
    for item in record["inputs"]:
        if not isinstance(item, dict):
            continue
        name = Path(str(item.get("path", "?"))).name
        chosen, total = item.get("chosen"), item.get("samples_in_file")
        how = "replayed from" if item.get("kind") == "replay" else "from"
        count = (
            f"{chosen:,} of {total:,}"
            if isinstance(chosen, int) and isinstance(total, int)
            else "?"
        )
        parts.append(f"{count} {how} {name}")
    return "mixture: " + " + ".join(parts)


def provenance_section(runs, evals, extra) -> tuple[str, str, str]:
    parts = ["<h3>This report</h3>"]
    here = {"git commit": source_commit() or "not a git checkout", **machine()}
    parts.append(h.table(["what", "value"], [[h.text(k), h.text(v)] for k, v in here.items()]))
    parts += _base_models(runs, evals, extra)
    versions = package_versions()
    seen = {}
    for e in [*evals.values(), *extra]:
        for name, version in ((e.data or {}).get("versions") or {}).items():
            seen.setdefault(name, set()).add("not installed" if version is None else str(version))
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
