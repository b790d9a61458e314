"""`mini-trainer report` on a small synthetic experiment whose metrics are known by hand."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
from helpers import REPO_ROOT, run_cli, subprocess_env

from mini_trainer.report.metrics import (
    average_accuracy,
    backward_transfer,
    build_matrix,
    frontier_point,
    pareto_front,
)

TASKS = ["a", "b", "c"]
# Accuracy after each stage (rows, 0 = base) on tasks a, b, c. None: the manifest names an eval
# file that was never written; "bad": an eval file that is not JSON (a failed job).
MATRICES = {
    ("sft", 0.01): [[0.1, 0.2, 0.3], [0.9, 0.25, 0.3], [0.5, 0.8, 0.35], [0.4, 0.6, 0.7]],
    ("sft", 0.001): [[0.1, 0.2, 0.3], [0.6, 0.2, 0.3], [0.58, 0.5, 0.3], [0.55, 0.45, 0.4]],
    ("osft", 0.01): [[0.1, 0.2, 0.3], [0.8, 0.2, 0.3], [0.7, "bad", 0.3], [0.75, 0.6, None]],
}


def test_aa_bwt_and_frontier_equal_hand_computed_values():
    m = MATRICES[("sft", 0.01)]
    assert math.isclose(average_accuracy(m), (0.4 + 0.6 + 0.7) / 3)
    assert math.isclose(backward_transfer(m), ((0.4 - 0.9) + (0.6 - 0.8)) / 2)
    assert frontier_point(m) == pytest.approx((0.7, 0.5))
    # After stage 2 only: tasks a and b seen, a learned at stage 1.
    assert math.isclose(average_accuracy(m, stage=2), (0.5 + 0.8) / 2)
    assert math.isclose(backward_transfer(m, stage=2), 0.5 - 0.9)
    assert average_accuracy(m, stage=0) is None  # nothing learned yet
    assert backward_transfer(m, stage=1) is None  # no earlier task
    low = MATRICES[("sft", 0.001)]
    assert math.isclose(average_accuracy(low), (0.55 + 0.45 + 0.4) / 3)
    assert math.isclose(backward_transfer(low), ((0.55 - 0.6) + (0.45 - 0.5)) / 2)
    # Missing cells make every metric that needs them missing, the others still count.
    holes = [[0.1, 0.2, 0.3], [0.8, 0.2, 0.3], [0.7, None, 0.3], [0.75, 0.6, None]]
    assert average_accuracy(holes) is None and frontier_point(holes) is None
    assert backward_transfer(holes) is None  # needs matrix[2][1]
    assert math.isclose(backward_transfer(holes, stage=2), 0.7 - 0.8)
    cells = {(s, j): v for s, row in enumerate(m) for j, v in enumerate(row)}
    assert build_matrix(3, 3, cells) == m
    assert build_matrix(3, 1, {(1, 0): 0.5}) == [[None] * 3, [0.5, None, None]]


def test_pareto_front_keeps_points_nothing_beats_on_both_axes():
    points = [(0.7, 0.5), (0.4, 0.5), (0.5, 0.6), (0.2, 0.1)]
    assert pareto_front(points) == [0, 2]


def write_experiment(root):
    """Eval JSONs, run folders and data summaries for MATRICES; return the manifest path."""
    entries = []
    for (method, lr), matrix in MATRICES.items():
        for stage, row in enumerate(matrix):
            if stage == 0 and method != "sft" or stage == 0 and lr != 0.01:
                continue  # one base row, shared
            for task, value in zip(TASKS, row, strict=True):
                who = "base" if stage == 0 else f"{method}/lr{lr:g}/stage{stage}"
                path = root / "eval" / who / f"{task}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                if value == "bad":
                    path.write_text("{torn")
                elif value is not None:
                    path.write_text(json.dumps({"token_accuracy": value, "loss": 1 - value,
                                                "perplexity": math.exp(1 - value),
                                                "exact_match": value / 2, "num_samples": 10,
                                                "versions": {"torch": "9.9"}}))  # fmt: skip
                entries.append({"kind": "eval", "path": str(path), "task": task,
                                "method": None if stage == 0 else method,
                                "lr": None if stage == 0 else lr, "stage": stage})  # fmt: skip
            if stage:
                run = root / "train" / f"{method}_lr{lr:g}_stage{stage}"
                run.mkdir(parents=True)
                rows = [{"step": k, "loss": 2.0 / k, "lr": lr * (1 - k / 10),
                         "tokens_per_second": 1000.0 + k} for k in range(1, 11)]  # fmt: skip
                (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
                (run / "training_args.json").write_text(
                    json.dumps(
                        {
                            "learning_rate": lr,
                            "seed": 0,
                            "method_hint": method,
                            "osft_svd_cache": "cache" if method == "osft" else None,
                        }
                    )
                )
                entries.append({"kind": "run", "path": str(run), "method": method, "lr": lr,
                                "stage": stage})  # fmt: skip
    summary = root / "data" / "a.summary.json"
    summary.parent.mkdir()
    length = {"p50": 33, "p99": 160, "max": 210}
    summary.write_text(
        json.dumps({"samples": 2000, "tokens": 81234, "loss_tokens": 30123, "dropped": 0,
                    "length": length})
    )  # fmt: skip
    entries.append({"kind": "data_summary", "path": str(summary), "task": "a"})
    entries.append({"kind": "data_summary", "path": str(root / "data" / "b.json"), "task": "b"})
    manifest = root / "manifest.json"
    manifest.write_text(json.dumps({"tasks": TASKS, "entries": entries}))
    return manifest


def is_png(path) -> bool:
    import matplotlib.image

    if path.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        return False
    pixels = matplotlib.image.imread(path)
    return pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100


def test_report_from_synthetic_runs(tmp_path):
    manifest = write_experiment(tmp_path)
    out = tmp_path / "report"
    result = run_cli("report", "--out", out, "--manifest", manifest)
    assert result.returncode == 0, result.stderr
    page = (out / "report.html").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted([
        "frontier.png", "matrix_osft_lr0.01.png", "matrix_sft_lr0.001.png",
        "matrix_sft_lr0.01.png", "throughput.png", "training_loss_lr.png",
    ])  # fmt: skip
    for name in pngs:
        assert is_png(out / name), name
        assert f'src="{name}"' in page, name
    assert sorted(set(re.findall(r'src="([^"]+)"', page))) == pngs  # nothing else referenced
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no temp left

    def summary_row(method, lr):
        match = re.search(rf"<tr><td>{method}</td><td>{lr}</td>(.*?)</tr>", page)
        assert match, (method, lr)
        return re.findall(r"<td[^>]*>(.*?)</td>", match.group(1))

    # last stage, AA, BWT, newest, retained: the hand-computed values above.
    assert summary_row("sft", "0.01") == ["3", "56.7%", "-35.0 pt", "70.0%", "50.0%"]
    assert summary_row("sft", "0.001") == ["3", "46.7%", "-5.0 pt", "40.0%", "50.0%"]
    assert summary_row("osft", "0.01") == ["3", "missing", "missing", "missing", "missing"]
    assert page.count('<td class="missing">missing</td>') >= 4
    assert re.search(r"stage 3 on c: \S+c\.json: no such file", page)
    assert re.search(r"stage 2 on b: \S+b\.json: unreadable", page)
    assert "Not on the plot" in page and "osft, lr 0.01" in page
    assert "shared learning rate" in page  # the frontier's note
    assert "81,234" in page and "no such file" in page  # data summaries, one missing
    assert "method_hint" in page and "git commit" in page  # provenance
    # An unset argument (None) is a value in the table of differing arguments, not a gap.
    differing = page.split("Arguments that differ between runs:")[1].split("</table>")[0]
    assert "<td>null</td>" in differing and "<td>cache</td>" in differing
    assert 'class="missing"' not in differing
    assert "9.9" in page  # versions recorded by evaluate

    again = run_cli("report", "--out", out, "--manifest", manifest)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_report_without_manifest_plots_the_given_runs(tmp_path):
    write_experiment(tmp_path)
    runs = sorted((tmp_path / "train").iterdir())[:2]
    result = run_cli("report", "--out", tmp_path / "r", *runs, tmp_path / "eval/base/a.json")
    assert result.returncode == 0, result.stderr
    page = (tmp_path / "r" / "report.html").read_text()
    assert sorted(p.name for p in (tmp_path / "r").glob("*.png")) == [
        "throughput.png", "training_loss_lr.png",
    ]  # fmt: skip
    assert "accuracy matrix" not in page and "10.0%" in page


def test_bad_manifest_is_reported_per_field_and_nothing_written(tmp_path):
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"tasks": ["a"], "entries": [
        {"kind": "eval", "path": "x.json", "method": "sft", "lr": 0.1, "stage": 1, "task": "z"},
        {"kind": "plot", "path": "y"},
        {"kind": "run", "path": "r", "method": None, "lr": None, "stage": 1},
    ]}))  # fmt: skip
    result = run_cli("report", "--out", tmp_path / "out", "--manifest", manifest)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: {manifest}: entries[0].task: 'z' is not one of the manifest's tasks",
        f"error: {manifest}: entries[1].kind: 'plot' is not one of eval, run, data_summary",
        f"error: {manifest}: entries[2].method: stage 1 needs the method it was trained with",
    ]
    assert not (tmp_path / "out").exists()


def test_report_package_never_imports_torch(tmp_path):
    manifest = write_experiment(tmp_path)
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from mini_trainer.report.build import build_report\n"
        f"build_report(Path({str(tmp_path / 'out')!r}), Path({str(manifest)!r}), [])\n"
        "import mini_trainer.report, mini_trainer.report.plots, mini_trainer.report.sections\n"
        "assert 'torch' not in sys.modules, 'report imported torch'\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
        cwd=REPO_ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok" and (tmp_path / "out" / "report.html").exists()


# What a reader of the page sees, read in the browser after the page has loaded.
READER_VIEW_JS = """(() => ({
  images: [...document.images].map(i => ({src: i.getAttribute("src"), complete: i.complete,
    width: i.naturalWidth, height: i.naturalHeight, shown: i.offsetWidth})),
  summary: [...document.querySelectorAll("#summary tbody tr")].map(
    tr => [...tr.cells].map(c => c.textContent.trim())),
  sections: [...document.querySelectorAll("section h2")].map(h => h.textContent.trim()),
  frontier: [...document.querySelectorAll("#frontier img")].map(i => i.getAttribute("src")),
  matrices: [...document.querySelectorAll("#matrices img")].map(i => i.getAttribute("src")),
  missing: document.querySelectorAll("td.missing").length,
}))()"""


@pytest.mark.slow
def test_pipeline_report_as_a_reader_sees_it_in_chromium(chromium, full_run, tmp_path):
    """The full demo run's report.html in headless Chromium: every image drawn, one AA/BWT row
    per method and learning rate, the frontier and every matrix, no console or load error."""
    from browser import view_page
    from test_pipeline import FULL_ROWS

    matrices = sorted(f"matrix_{method}_lr{lr}.png" for method, lr in FULL_ROWS)
    shot = tmp_path / "report.png"
    seen = view_page(chromium, full_run / "results/report/report.html", READER_VIEW_JS, shot)
    view = seen.result
    assert seen.problems == [], seen.problems
    sources = sorted(image["src"] for image in view["images"])
    assert sources == sorted(["frontier.png", *matrices, "throughput.png", "training_loss_lr.png"])
    for image in view["images"]:
        assert image["complete"] and image["width"] > 100 and image["height"] > 100, image
        assert image["shown"] > 100, image  # laid out on the page, not hidden
    rows = {(row[0], row[1]): row[2:] for row in view["summary"]}
    assert sorted(rows) == sorted((m, str(lr)) for m, lr in FULL_ROWS), view["summary"]
    for method_lr, (last_stage, aa, bwt, *_) in rows.items():
        assert last_stage == "2", method_lr
        assert re.fullmatch(r"\d+\.\d%", aa) and re.fullmatch(r"[+-]\d+\.\d pt", bwt), rows
    assert view["sections"][:3] == [
        "Average accuracy (AA) and backward transfer (BWT)",
        "Frontier: retained accuracy vs. newest-task accuracy",
        "Accuracy matrices",
    ], view["sections"]
    assert view["frontier"] == ["frontier.png"]
    assert sorted(view["matrices"]) == matrices
    assert view["missing"] == 0
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)  # the whole page, drawn
    assert pixels.shape[1] == 1280 and pixels.shape[0] > 2000, pixels.shape
    colours = {tuple(p) for p in (pixels[::7, ::7, :3] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 200, len(colours)


def test_screenshot_script_draws_the_page(chromium, tmp_path):
    """scripts/screenshot_report.sh (how docs/ pictures are made) on the synthetic report."""
    manifest = write_experiment(tmp_path)
    assert run_cli("report", "--out", tmp_path / "out", "--manifest", manifest).returncode == 0
    shot = tmp_path / "shot.png"
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "screenshot_report.sh"),
         str(tmp_path / "out" / "report.html"), str(shot), "1600"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (1600, 1280)
    # A page with its images drawn, not a blank or an error page: many distinct colours.
    colours = {tuple(p) for p in (pixels[::7, ::7, :3] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 200, len(colours)
