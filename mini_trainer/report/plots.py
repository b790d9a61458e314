"""The report's PNG plots, drawn with matplotlib's Agg backend (no display needed).

Each function draws one figure into `path` and closes it. Missing values are drawn as missing
(hatched, labelled "missing"), never interpolated.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from mini_trainer.report.inputs import Curve, RunData  # noqa: E402
from mini_trainer.report.metrics import Cell  # noqa: E402

DPI = 110


def _save(fig, path: Path, bottom: float = 0.0) -> None:
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _series(run: RunData, key: str) -> tuple[list[int], list[float]]:
    pairs = [
        (row["step"], row[key])
        for row in run.rows
        if isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool)
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


Panels = dict[str, Sequence[Curve]]
"""Panel title (a method) -> its curves."""
STYLES = ("-", "--", ":", "-.")
"""Line style per learning rate within a panel (colour is the stage)."""


def _line_styles(curves: Sequence[Curve]) -> list[tuple]:
    """(colour, line style) per curve of a panel: a colour per stage, a style per learning
    rate, so a method's few curves read apart."""
    colours = plt.get_cmap("tab10")
    stages: dict = {}
    lrs: dict = {}
    styles = []
    for i, curve in enumerate(curves):
        colour = stages.setdefault(i if curve.stage is None else curve.stage, len(stages))
        style = lrs.setdefault(curve.lr, len(lrs))
        styles.append((colours(colour % colours.N), STYLES[style % len(STYLES)]))
    return styles


def plot_training(name: str, curves: Sequence[Curve], path: Path) -> None:
    """One method's runs: loss (left) and learning rate (right) against step; a colour per
    stage, a line style per learning rate, the legend beside the panels."""
    fig, (ax_loss, ax_lr) = plt.subplots(1, 2, figsize=(11, 3.3))
    validated = False
    for curve, (colour, style) in zip(curves, _line_styles(curves), strict=True):
        run, legend = curve.run, curve.legend
        ax_loss.plot(*_series(run, "loss"), color=colour, ls=style, lw=1.3, label=legend)
        ax_lr.plot(*_series(run, "lr"), color=colour, ls=style, lw=1.3, label=legend)
        validated |= _plot_validation(ax_loss, run, colour)
    title = f"{name}: loss" + (" (dots: validation, \u2605 best step)" if validated else "")
    ax_loss.set(xlabel="step", ylabel="loss (answer tokens)", title=title, yscale="log")
    # Plain numbers at 1, 2, 5 x 10^k on the log axis (not "6 x 10^0" on every minor tick).
    ax_loss.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax_loss.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax_loss.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax_lr.set(xlabel="step", ylabel="learning rate", title=f"{name}: learning rate")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax_lr.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    for ax in (ax_loss, ax_lr):
        ax.grid(alpha=0.3)
    _save(fig, path)


def _plot_validation(ax, run: RunData, colour) -> bool:
    """The run's validation loss, dotted in the run's colour; a star marks the best step.
    Whether it had any."""
    steps, values = _series(RunData(run.path, run.label, run.validation_rows()), "val_loss")
    if not steps:
        return False
    ax.plot(steps, values, color=colour, lw=1.0, ls=":", marker="o", ms=3)
    best = run.best_validation()
    if best is not None:
        ax.plot(*best, color=colour, marker="*", ms=13, mec="black", mew=0.6, ls="none")
    return True


def plot_throughput(panels: Panels, path: Path) -> None:
    """Training tokens per second against step, one panel per method, side by side."""
    count = len(panels)
    columns = min(3, count)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(11, 2.9 * rows + 0.3), squeeze=False,
                             sharey=True)  # fmt: skip
    for ax, (name, lines) in zip(axes.flat, panels.items(), strict=False):
        for curve, (colour, style) in zip(lines, _line_styles(lines), strict=True):
            ax.plot(*_series(curve.run, "tokens_per_second"), color=colour, ls=style, lw=1,
                    label=curve.legend)  # fmt: skip
        ax.set(xlabel="step", title=f"{name}: tokens/s (all ranks)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5, loc="lower right")
    for ax in list(axes.flat)[count:]:
        ax.set_visible(False)
    axes[0][0].set_ylabel("tokens / s")
    _save(fig, path)


def plot_matrix(
    matrix: Sequence[Sequence[Cell]], tasks: Sequence[str], title: str, path: Path
) -> None:
    """Accuracy after each stage (rows) on each task (columns) as an annotated heatmap."""
    rows, cols = len(matrix), len(tasks)
    values = np.array([[np.nan if v is None else v for v in row] for row in matrix], dtype=float)
    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * cols, 1.0 + 0.62 * rows))
    image = ax.imshow(np.ma.masked_invalid(values), cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for s in range(rows):
        for j in range(cols):
            if np.isnan(values[s, j]):
                ax.add_patch(
                    plt.Rectangle((j - 0.5, s - 0.5), 1, 1, facecolor="#eeeeee",
                                  edgecolor="#999999", hatch="//")
                )  # fmt: skip
                ax.text(j, s, "missing", ha="center", va="center", fontsize=9, color="#b00020")
            else:
                value = values[s, j]
                ax.text(j, s, f"{value:.1%}", ha="center", va="center", fontsize=10,
                        color="white" if value < 0.6 else "black")  # fmt: skip
    ax.set_xticks(range(cols), [f"eval: {t}" for t in tasks], fontsize=9)
    labels = ["base model"] + [f"after {s}: {tasks[s - 1]}" for s in range(1, rows)]
    ax.set_yticks(range(rows), labels, fontsize=9)
    ax.set_title(title, fontsize=11)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, label="token accuracy")
    _save(fig, path)


def plot_frontier(
    series: dict[str, list[tuple[float, float, str]]],
    path: Path,
    front: dict[str, list[int]],
    reference: tuple[str, float, float] | None = None,
) -> None:
    """Per method, retained earlier-task accuracy against newest-task accuracy.

    `series[method]` holds (newest, retained, label) per learning rate; `front[method]` the
    indices on that method's Pareto front (drawn as a line; the others as hollow points).
    `reference` (label, newest, retained), the multi-task bound, is two dashed grey lines
    through its point, not a series.
    """
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    if reference is not None:
        label, newest, retained = reference
        ax.axhline(retained, color="0.45", ls="--", lw=1.2, label=label)
        ax.axvline(newest, color="0.45", ls="--", lw=1.2)
    colours = plt.get_cmap("tab10")
    for i, (method, points) in enumerate(sorted(series.items())):
        colour = colours(i % colours.N)
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        on_front = set(front.get(method, []))
        ordered = sorted((xs[k], ys[k]) for k in on_front)
        if ordered:
            ax.plot([p[0] for p in ordered], [p[1] for p in ordered], color=colour, lw=1.5,
                    label=f"{method} (frontier)")  # fmt: skip
        for k, (x, y, label) in enumerate(points):
            filled = k in on_front
            ax.scatter([x], [y], s=60, color=colour if filled else "white", edgecolor=colour,
                       zorder=3, linewidths=1.5)  # fmt: skip
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 5), fontsize=8)
    ax.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02))
    ax.set_xlabel("accuracy on the newest task (learning)")
    ax.set_ylabel("mean accuracy on earlier tasks (retention)")
    ax.set_title("Retention vs. learning, one point per learning rate")
    ax.grid(alpha=0.3)
    if series or reference is not None:
        ax.legend(fontsize=8, loc="lower left")
    _save(fig, path)
