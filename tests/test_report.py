"""`mini-trainer report` on a small synthetic experiment whose metrics are known by hand."""

from __future__ import annotations

import json
import math
import re
import subprocess

import pytest
from helpers import REPO_ROOT, run_cli, run_python

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
    # Replay's stage 1 is SFT's at lr 0.01 (the same run folder and evaluation files).
    ("replay", 0.01): [[0.1, 0.2, 0.3], [0.9, 0.25, 0.3], [0.85, 0.8, 0.35], [0.8, 0.7, 0.7]],
}
SHARED = {("replay", 0.01, 1): ("sft", 0.01, 1)}
"""Cells whose run and evaluations are another method's (as the pipeline writes them)."""


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
            owner = SHARED.get((method, lr, stage), (method, lr, stage))
            for task, value in zip(TASKS, row, strict=True):
                who = "base" if stage == 0 else "{}/lr{:g}/stage{}".format(*owner)
                path = root / "eval" / who / f"{task}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                if value == "bad":
                    path.write_text("{torn")
                elif value is not None:
                    path.write_text(json.dumps({"token_accuracy": value, "loss": 1 - value,
                                                "perplexity": math.exp(1 - value),
                                                "exact_match": value / 2, "num_samples": 10,
                                                "versions": {"torch": "9.9",
                                                             "lm_eval": None}}))  # fmt: skip
                entries.append({"kind": "eval", "path": str(path), "task": task,
                                "method": None if stage == 0 else method,
                                "lr": None if stage == 0 else lr, "stage": stage})  # fmt: skip
            if stage:
                run = root / "train" / "{}_lr{:g}_stage{}".format(*owner)
                entries.append({"kind": "run", "path": str(run), "method": method, "lr": lr,
                                "stage": stage})  # fmt: skip
                if owner != (method, lr, stage):
                    continue
                run.mkdir(parents=True)
                rows = [{"step": k, "loss": 2.0 / k, "lr": lr * (1 - k / 10),
                         "tokens_per_second": 1000.0 + k, "num_tokens": 100 * k,
                         "step_time_s": 0.5} for k in range(1, 11)]  # fmt: skip
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
    summary = root / "data" / "a.summary.json"
    summary.parent.mkdir()
    length = {"p50": 33, "p99": 160, "max": 210}
    summary.write_text(
        json.dumps({"samples": 2000, "tokens": 81234, "loss_tokens": 30123, "dropped": 0,
                    "length": length})
    )  # fmt: skip
    entries.append({"kind": "data_summary", "path": str(summary), "task": "a"})
    entries.append({"kind": "data_summary", "path": str(root / "data" / "b.json"), "task": "b"})
    # Replay's stage 2 trains on a mixture: its summary, and the `mix` sidecar beside the data.
    mixed = root / "data" / "b-replay0.25.jsonl"
    (root / "data" / "b-replay0.25.mix.json").write_text(json.dumps({"inputs": [
        {"path": "data/b.train.jsonl", "kind": "weight", "samples_in_file": 2000, "chosen": 2000},
        {"path": "data/a.train.jsonl", "kind": "replay", "samples_in_file": 2000, "chosen": 500},
    ]}))  # fmt: skip
    mix_summary = root / "data" / "b-replay0.25.summary.json"
    mix_summary.write_text(json.dumps({"data_file": str(mixed), "samples": 2500, "length": length}))
    entries.append({"kind": "data_summary", "path": str(mix_summary), "task": "b"})
    manifest = root / "manifest.json"
    manifest.write_text(json.dumps({"tasks": TASKS, "entries": entries}))
    return manifest


def test_methods_are_labelled_costed_and_the_bound_is_a_reference_line(tmp_path):
    """With the manifest's method descriptions and benchmark files: a table of each method's
    label and settings, the cost of each (method, lr) (tokens and step time from its runs'
    metrics, wall time from its jobs' benchmark files; a shared run costs both methods), and the
    multi-task bound on the frontier as reference lines, not as a series."""
    from mini_trainer.report import build, sections

    manifest = write_experiment(tmp_path)
    content = json.loads(manifest.read_text())
    # The multi-task bound: evaluated after the last stage only (newest c 0.75, retained 0.85).
    for task, value in zip(TASKS, [0.9, 0.8, 0.75], strict=True):
        path = tmp_path / "eval" / "multitask" / f"{task}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"token_accuracy": value}))
        content["entries"].append({"kind": "eval", "path": str(path), "task": task,
                                   "method": "multitask", "lr": 0.01, "stage": 3})  # fmt: skip
    for stage in (1, 2, 3):  # SFT lr 0.01: three training jobs of 12.5 s; OSFT's stage 3 lost
        for method, seconds in (("sft", "12.5"), ("osft", None if stage == 3 else "20")):
            bench = tmp_path / "bench" / f"{method}{stage}.tsv"
            bench.parent.mkdir(exist_ok=True)
            if seconds:
                bench.write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:12\t100\n")
            content["entries"].append({"kind": "benchmark", "path": str(bench),
                                       "method": method, "lr": 0.01, "stage": stage})  # fmt: skip
    info = {"label": "SFT", "method": "sft", "settings": {}, "bound": False}
    content["methods"] = {
        "sft": info, "osft": {**info, "label": "OSFT", "method": "osft",
                              "settings": {"osft_unfreeze_rank_ratio": 0.25}},
        "replay": {**info, "settings": {"replay_fraction": 0.25}},
        "multitask": {**info, "settings": {"multitask": True}, "bound": True},
    }  # fmt: skip
    manifest.write_text(json.dumps(content))
    assert run_cli("report", "--out", tmp_path / "out", "--manifest", manifest).returncode == 0
    page = (tmp_path / "out" / "report.html").read_text()
    methods = page.split('<section id="methods">')[1].split("</section>")[0]
    assert "<tr><td>osft</td><td>OSFT</td><td>osft</td><td>series</td>" in methods
    assert "<td>osft_unfreeze_rank_ratio: 0.25</td>" in methods
    assert "<td>replay_fraction: 0.25</td>" in methods
    assert "<tr><td>multitask</td><td>SFT</td><td>sft</td><td>multi-task bound" in methods

    def cost_row(method, lr):
        match = re.search(rf"<tr><td>{method}</td><td>lr {lr}</td>(.*?)</tr>", methods)
        return re.findall(r"<td[^>]*>(.*?)</td>", match.group(1))

    # 3 runs of 10 steps: tokens 3 x (100 + ... + 1000) = 16,500, step time 3 x 10 x 0.5 s.
    assert cost_row("sft", "0.01") == ["3", "16,500", "15.0", "37.5", "3"]
    # replay pays for SFT's stage-1 run it shares; no benchmark listed for it
    assert cost_row("replay", "0.01") == ["3", "16,500", "15.0", "0.0", "0"]
    assert cost_row("osft", "0.01") == ["3", "16,500", "15.0", "missing", "3"]
    assert "osft3.tsv: no such file" in methods
    frontier = page.split('<section id="frontier">')[1].split("</section>")[0]
    assert "multi-task bound, lr 0.01" in frontier and "85.0% retained, 75.0% on the" in frontier

    drawn = {}

    class Plots:  # what the frontier hands to matplotlib
        @staticmethod
        def plot_frontier(series, path, front, reference):
            drawn.update(series=series, reference=reference)

    groups, _ = build.collect_groups(build.load_manifest(manifest))
    sections.frontier_section(groups, tmp_path, Plots, "note", frozenset({"multitask"}))
    assert sorted(drawn["series"]) == ["replay", "sft"]  # the bound is no series
    label = "multitask (multi-task bound, lr 0.01)"
    assert drawn["reference"] == (label, 0.75, pytest.approx(0.85))


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
        "frontier.png", "matrix_osft_lr0.01.png", "matrix_replay_lr0.01.png",
        "matrix_sft_lr0.001.png", "matrix_sft_lr0.01.png", "throughput.png",
        "training_osft.png", "training_replay.png", "training_sft.png",
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


def page_text(page: str) -> str:
    """The page as a reader reads it: tags dropped, entities decoded."""
    import html

    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def test_shared_runs_are_shown_and_counted_once(tmp_path):
    """Replay's stage 1 is SFT's run: one row in the training and evaluation tables, named with
    both methods; the header counts run folders and evaluation files as they are on disk."""
    manifest = write_experiment(tmp_path)
    out = tmp_path / "report"
    assert run_cli("report", "--out", out, "--manifest", manifest).returncode == 0
    page = (out / "report.html").read_text()
    runs = {p.name for p in (tmp_path / "train").iterdir()}
    evals = {p for p in (tmp_path / "eval").rglob("*.json")}
    assert len(runs) == 11 and len(evals) == 35  # 12 run cells, 39 evaluation cells
    named = {e["path"] for e in json.loads(manifest.read_text())["entries"] if e["kind"] == "eval"}
    assert len(named) == 36  # one named file was never written
    header = re.search(r'<p class="meta">(.*?)</p>', page).group(1)
    assert "11 training runs, 36 evaluation files (2 missing or unreadable)" in header, header
    assert "1 run(s) shared by two methods, shown once" in header
    training = page.split('id="training"')[1].split("</section>")[0]
    assert training.count("<tr>") == 1 + 11  # header row and one row per run folder
    assert "sft lr 0.01 stage 1 (a); also replay lr 0.01 stage 1" in training
    evaluations = page.split('id="evals"')[1].split("</section>")[0]
    assert evaluations.count("<tr>") == 1 + 36
    assert evaluations.count("<td>sft lr 0.01; replay lr 0.01</td>") == 3  # its three tasks
    assert "replay lr 0.01 stage 1 is the run of sft lr 0.01 stage 1" in page  # the summary's note


def test_page_has_no_empty_column_and_no_python_repr(tmp_path):
    """Without validation the best-val columns are left out, and the page says why; the Data
    section shows the mixture and what it holds; no `None` or `nan` reaches the reader."""
    manifest = write_experiment(tmp_path)
    out = tmp_path / "report"
    assert run_cli("report", "--out", out, "--manifest", manifest).returncode == 0
    page = (out / "report.html").read_text()
    assert "best val loss" not in page and "No run scored a validation set" in page
    data = page_text(page.split('id="data"')[1].split("</section>")[0])
    assert "b-replay0.25.jsonl" in data and "2,500" in data
    contents = "2,000 of 2,000 from b.train.jsonl + 500 of 2,000 replayed from a.train.jsonl"
    assert f"mixture: {contents}" in data
    text = page_text(page)
    assert not re.search(r"\b(None|nan|NaN)\b", text), re.search(r".{60}\bNone\b.{60}", text)


def test_report_without_manifest_plots_the_given_runs(tmp_path):
    write_experiment(tmp_path)
    runs = sorted((tmp_path / "train").iterdir())[:2]
    result = run_cli("report", "--out", tmp_path / "r", *runs, tmp_path / "eval/base/a.json")
    assert result.returncode == 0, result.stderr
    page = (tmp_path / "r" / "report.html").read_text()
    assert sorted(p.name for p in (tmp_path / "r").glob("*.png")) == [
        "throughput.png", "training_runs.png",
    ]  # fmt: skip
    assert "accuracy matrix" not in page and "10.0%" in page


def test_bad_manifest_is_reported_per_field_and_nothing_written(tmp_path):
    manifest = tmp_path / "m.json"
    bad_info = {"label": "SFT", "method": "sft", "settings": {}, "bound": "no"}
    manifest.write_text(json.dumps({"tasks": ["a"], "entries": [
        {"kind": "eval", "path": "x.json", "method": "sft", "lr": 0.1, "stage": 1, "task": "z"},
        {"kind": "plot", "path": "y"},
        {"kind": "run", "path": "r", "method": None, "lr": None, "stage": 1},
    ], "methods": {"sft": bad_info}}))  # fmt: skip
    result = run_cli("report", "--out", tmp_path / "out", "--manifest", manifest)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: {manifest}: entries[0].task: 'z' is not one of the manifest's tasks",
        f"error: {manifest}: entries[1].kind: 'plot' is not one of eval, run, data_summary, "
        "benchmark, score",
        f"error: {manifest}: entries[2].method: stage 1 needs the method it was trained with",
        f"error: {manifest}: methods.sft.bound: expected a bool",
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
    result = run_python(code)
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
  header: document.querySelector("p.meta").textContent,
  curves: [...document.querySelectorAll("#training .curves")].map(d => ({
    method: d.querySelector("h3").textContent.trim(),
    width: d.querySelector("img").naturalWidth, shown: d.querySelector("img").offsetWidth})),
  trainingRows: document.querySelectorAll("#training tbody tr").length,
  trainingHeaders: [...document.querySelectorAll("#training th")].map(t => t.textContent),
  text: document.body.innerText,
}))()"""


def check_reader_view(view: dict, methods: list[str]) -> None:
    """What any report page must show a reader: one loss panel per method, drawn and laid out;
    no empty best-validation columns without validation; no Python repr in the text."""
    assert [c["method"] for c in view["curves"]] == sorted(methods), view["curves"]
    assert all(c["width"] > 500 and c["shown"] > 500 for c in view["curves"]), view["curves"]
    if "best val loss" not in view["trainingHeaders"]:
        assert "No run scored a validation set" in view["text"]
    assert not re.search(r"\b(None|nan|NaN)\b", view["text"]), view["text"]


@pytest.mark.slow
def test_pipeline_report_as_a_reader_sees_it_in_chromium(chromium, full_run, tmp_path):
    """The full demo run's report.html in headless Chromium: every image drawn, one AA/BWT row
    per method and learning rate, the frontier and every matrix, no console or load error."""
    from browser import view_page
    from test_pipeline import FULL_ROWS

    matrices = sorted(f"matrix_{method}_lr{lr}.png" for method, lr in FULL_ROWS)
    methods = [method for method, _ in FULL_ROWS]
    shot = tmp_path / "report.png"
    seen = view_page(chromium, full_run / "results/report/report.html", READER_VIEW_JS, shot)
    view = seen.result
    assert seen.problems == [], seen.problems
    sources = sorted(image["src"] for image in view["images"])
    curves = [f"training_{method}.png" for method in methods]
    assert sources == sorted(["frontier.png", *matrices, "throughput.png", *curves])
    check_reader_view(view, methods)
    # Replay's stage 1 is SFT's run: 2 stages x 3 methods, less the shared one; the base model
    # and 5 checkpoints, each evaluated on the 2 tasks.
    assert view["trainingRows"] == 5, view["trainingRows"]
    assert "5 training runs, 12 evaluation files" in view["header"], view["header"]
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


def test_synthetic_report_as_a_reader_sees_it_in_chromium(chromium, tmp_path):
    """The synthetic experiment's page in headless Chromium: a loss panel per method, every
    image drawn, shared runs once, no empty column and no Python repr."""
    from browser import view_page

    manifest = write_experiment(tmp_path)
    assert run_cli("report", "--out", tmp_path / "out", "--manifest", manifest).returncode == 0
    seen = view_page(chromium, tmp_path / "out" / "report.html", READER_VIEW_JS,
                     tmp_path / "shot.png")  # fmt: skip
    assert seen.problems == [], seen.problems
    view = seen.result
    check_reader_view(view, ["osft", "replay", "sft"])
    assert view["trainingRows"] == 11  # 12 run cells, replay's stage 1 being SFT's run
    for image in view["images"]:
        assert image["complete"] and image["width"] > 100 and image["shown"] > 100, image


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
    # Beside the picture, the page's structure, as the test of docs/report.png reads it.
    structure = json.loads((tmp_path / "shot.structure.json").read_text())
    page = (tmp_path / "out" / "report.html").read_text()
    assert structure["sections"] == re.findall(r"<h2>(.*?)</h2>", page) and structure["rows"]
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (1600, 1280)
    # A page with its images drawn, not a blank or an error page: many distinct colours.
    colours = {tuple(p) for p in (pixels[::7, ::7, :3] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 200, len(colours)


def test_the_readme_screenshot_shows_the_current_report(tmp_path):
    """docs/report.png was taken of a page with the sections and (method, learning rate) rows
    recorded beside it (docs/report.structure.json, written by scripts/screenshot_report.sh):
    the report built now has the same sections, and the default experiment the same rows.
    When this fails, rerun the demo and the script (README, "Set up") to retake the picture."""
    import yaml

    from mini_trainer.report.structure import page_structure

    recorded = json.loads((REPO_ROOT / "docs" / "report.structure.json").read_text())
    manifest = write_experiment(tmp_path)
    assert run_cli("report", "--out", tmp_path / "out", "--manifest", manifest).returncode == 0
    now = page_structure((tmp_path / "out" / "report.html").read_text())
    assert recorded["sections"] == now["sections"], "the report's sections changed"
    config = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    rows = sorted([method, f"{lr:g}"] for method, spec in config["methods"].items()
                  for lr in spec["learning_rates"])  # fmt: skip
    assert sorted(recorded["rows"]) == rows, "the default experiment's methods changed"
