"""TRACE (arXiv:2310.06762) offline: its files as chat JSONL, its per-task metrics against values
computed by hand (and SARI against its published example), OP and BWT, and config/trace.yaml.

The fixtures under tests/fixtures/trace/ are tiny files in TRACE's own layout and format
(`<task>/{train,test}.json`, JSON arrays of {"prompt", "answer"}); nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from helpers import REPO_ROOT, run_cli

from mini_trainer.data.chat import check_messages
from mini_trainer.data.trace import INSTRUCTIONS, TASKS, read_samples, source_file
from mini_trainer.evaluate import trace_metrics as tm
from mini_trainer.report.metrics import average_accuracy, backward_transfer

FIXTURES = REPO_ROOT / "tests/fixtures/trace"


def test_every_trace_task_becomes_chat_jsonl_line_for_line(tmp_path):
    """Each fixture file: one chat line per sample, the prompt (with TRACE's instruction at its
    start) as the user turn and the answer as the assistant turn, both verbatim."""
    for task in TASKS:
        source = source_file(FIXTURES, task, "eval")
        out = tmp_path / f"{task}.eval.jsonl"
        result = run_cli("trace-chat", source, "--out", out, check=True)
        assert f"({len(read_samples(source))} samples)" in result.stdout
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        assert result.stderr.splitlines() == [f"{source}: not pinned: SHA-256 {digest} (pin it "
                                              "with --sha256, or the pipeline config's "
                                              "trace.sha256)"]  # fmt: skip
        lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        for line, sample in zip(lines, read_samples(source), strict=True):
            assert check_messages(line["messages"]) is None
            user, reply = line["messages"]
            assert (user["role"], reply["role"]) == ("user", "assistant")
            assert (user["content"], reply["content"]) == (sample["prompt"], sample["answer"])
            assert user["content"].startswith(INSTRUCTIONS[task])


def test_a_bad_trace_file_names_each_sample_and_writes_nothing(tmp_path):
    source = tmp_path / "test.json"
    source.write_text(json.dumps([{"prompt": "p", "answer": "a"}, {"prompt": 3, "answer": ""},
                                  "x"]))  # fmt: skip
    out = tmp_path / "out.jsonl"
    result = run_cli("trace-chat", source, "--out", out)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: {source}:1: prompt: must be a string",
        f"error: {source}:1: answer: empty (nothing to train on or score)",
        f"error: {source}:2: expected an object with prompt and answer",
    ]
    assert not out.exists()


def test_accuracy_is_exact_string_equality_and_scienceqa_its_option_letter():
    # "C " is not "C" (TRACE does not strip); an empty pair scores 0 and still counts.
    assert tm.accuracy(["A", "B", "", "C "], ["A", "C", "", "C"]) == 1 / 4
    assert tm.first_character_accuracy(
        ["A\nBecause x.", "B\nfoo", ""], ["A\nBecause y.", "C\nfoo", "A\nz"]
    ) == 1 / 3  # fmt: skip


def test_rouge_l_is_the_rouge_packages_summary_level_f_on_word_sets():
    # answer sentences "the cat sat" | "on the mat"; prediction "the cat is on the mat":
    # union LCS words {the, cat, on, mat} = 4, distinct words 5 and 5: P = R = 4/5.
    assert tm.rouge_l("the cat sat. on the mat", "the cat is on the mat") == pytest.approx(
        2 * 0.8 * 0.8 / (1.6 + 1e-8), abs=1e-12
    )
    # word sets: "a a a b" against "a b" is a perfect match (a token LCS would give 2/3)
    assert tm.rouge_l("a a a b", "a b") == pytest.approx(1.0, abs=1e-7)
    assert tm.rouge_l("...", "a b") == 0.0
    # the mean: (answer, prediction) pairs, an empty prediction scores 0 and counts
    assert tm.mean_rouge_l(["a b", ""], ["a a a b", "x"]) == pytest.approx(0.5, abs=1e-7)


def test_edit_similarity_is_fuzz_ratio_after_py150_literal_postprocessing():
    literals = "x = <NUM_LIT> ; s = <STR_LIT:hi> + <STR_LIT>"
    assert tm.py150_postprocess(literals) == "x = 0 ; s = hi + "
    assert tm.fuzz_ratio("abcd", "abce") == 75  # 2 * 3 matches / 8 characters
    assert tm.fuzz_ratio("abc", "abd") == 67  # 66.67 rounded
    assert tm.fuzz_ratio("", "a") == 0
    # 100 (equal after post-processing) + 75 + 0 (empty), over 3 samples, on [0, 1]
    assert tm.edit_similarity(["x = <NUM_LIT>", "abcd", ""], ["x = 0", "abce", "y"]) == (
        pytest.approx(175 / 3 / 100)
    )


def test_sari_by_hand_and_its_published_example():
    # source "a b", prediction "a b", reference "a c": keep (2/3, 0, 1, 1), deletion (1, 1, 1, 1),
    # addition (0, 0, 1, 1) over n = 1..4: (2/3 + 1 + 1/2) / 3 = 13/18.
    assert tm.sari_sentence("a b", "a b", ["a c"]) == pytest.approx(13 / 18)
    assert tm.sari_sentence("a b", "a c", ["a c"]) == pytest.approx(1.0)
    # the `sari` metric's own docstring example: 26.953601953601954 (on 0..100)
    published = tm.sari_sentence(
        "About 95 species are currently accepted .",
        "About 95 you now get in .",
        ["About 95 species are currently known .", "About 95 species are now accepted .",
         "95 species are now accepted ."],
    )  # fmt: skip
    assert published * 100 == pytest.approx(26.953601953601954, rel=1e-12)
    assert tm.mean_sari(["a b", "a b"], ["a b", "a c"], ["a c", "a c"]) == pytest.approx(
        (13 / 18 + 1) / 2
    )


def test_13a_tokenizer_matches_sacrebleu():
    tokenizer = pytest.importorskip("sacrebleu.tokenizers.tokenizer_13a").Tokenizer13a()
    for text in ['Hello, world! 3.5-4 a&amp;b "q" (x) 1,000.', "Die Stadt-Verwaltung hat "
                 "2.5 Mio. CHF ausgegeben.\nZweite-\nZeile <skipped>"]:  # fmt: skip
        assert tm.tokenize_13a(text) == tokenizer(text)


def test_trace_score_scores_a_predictions_file_with_the_tasks_metric(tmp_path):
    data = source_file(FIXTURES, "ScienceQA", "eval")
    answers = [s["answer"] for s in read_samples(data)]
    predictions = tmp_path / "pred.jsonl"
    predictions.write_text(
        "\n".join(json.dumps({"prediction": p}) for p in [answers[0][0] + "\nno", "Z"]) + "\n"
    )
    out = tmp_path / "score.json"
    run_cli("trace-score", "--task", "ScienceQA", "--data", data, "--predictions", predictions,
            "--out", out, check=True)  # fmt: skip
    assert json.loads(out.read_text()) == {
        "task": "ScienceQA", "metric": "accuracy", "score": 0.5, "num_samples": 2
    }  # fmt: skip
    predictions.write_text(json.dumps({"prediction": "A"}) + "\n")
    result = run_cli("trace-score", "--task", "ScienceQA", "--data", data, "--predictions",
                     predictions, "--out", out, "--force")  # fmt: skip
    assert result.returncode == 2
    assert "1 predictions for 2 samples" in result.stderr


def test_trace_op_and_bwt_are_the_reports_aa_and_bwt_on_the_score_matrix():
    """TRACE's OP_T = mean_i R[T][i] and BWT_T = mean_{i<T} (R[T][i] - R[i][i]); with the
    report's rows (0 = base model, stage s after task s-1) they are its AA and BWT."""
    matrix = [
        [0.1, 0.2, 0.3],
        [0.8, 0.2, 0.3],
        [0.6, 0.9, 0.3],
        [0.5, 0.7, 0.9],
    ]
    assert average_accuracy(matrix) == pytest.approx((0.5 + 0.7 + 0.9) / 3)
    assert backward_transfer(matrix) == pytest.approx(((0.5 - 0.8) + (0.7 - 0.9)) / 2)


def test_the_trace_config_plans_every_task_from_traces_files_and_refuses_a_mismatch():
    """config/trace.yaml as the Snakefile sees it (schema-validated, defaults filled in, checked):
    each stage's files come from the trace_chat rule, which reads TRACE's layout under
    `trace.root` and pins a file by its checksum. (`snakemake -n` of it, with `model: demo` and
    the root at tests/fixtures/trace, plans 818 jobs.)"""
    from snakemake.utils import validate

    from mini_trainer import pipeline

    config = pipeline.read_config_file(REPO_ROOT / "config/trace.yaml")
    validate(config, str(REPO_ROOT / "workflow/schemas/config.schema.yaml"))
    pipeline.check_config(config)
    assert config["stages"] == list(TASKS)
    root = config["trace"]["root"]
    assert pipeline.trace_source(config, "Py150", "eval") == f"{root}/Py150/test.json"
    assert pipeline.trace_chat_flags(config, "Py150", "eval") == ""
    pinned = {**config, "trace": {**config["trace"], "sha256": {"Py150/test.json": "ab" * 32}}}
    pipeline.check_config(pinned)
    assert pipeline.trace_chat_flags(pinned, "Py150", "eval") == f" --sha256 {'ab' * 32}"
    for change, message in [
        ({"trace": {**config["trace"], "sha256": {"Py150/eval.jsonl": "ab" * 32}}},
         "config: trace.sha256.Py150/eval.jsonl: not a TRACE file"),
        ({"tasks": {**config["tasks"], "FOMC": {**config["tasks"]["FOMC"], "format": "tokenized"}}},
         "config: tasks.FOMC.format: 'chat' expected with `trace:`"),
    ]:  # fmt: skip
        with pytest.raises(pipeline.ConfigError) as caught:
            pipeline.check_config({**config, **change})
        assert str(caught.value).startswith(message)


def test_trace_chat_refuses_a_file_whose_checksum_differs(tmp_path):
    source = source_file(FIXTURES, "FOMC", "train")
    out = tmp_path / "out.jsonl"
    result = run_cli("trace-chat", source, "--out", out, "--sha256", "0" * 64)
    assert result.returncode == 2
    assert f"{source}: SHA-256 " in result.stderr and f"expected {'0' * 64}" in result.stderr
    assert not out.exists()


def test_generate_answers_greedily_from_the_chat_prompt_as_a_token_by_token_argmax(
    demo_dir, tmp_path
):
    """`mini-trainer generate` on TRACE-format chat lines: each answer is the model's greedy
    continuation of the rendered prompt (checked against an argmax loop, one token at a time),
    the same in batches of 2 as one at a time, one prediction per line, ready for trace-score."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    chat = tmp_path / "chat.jsonl"
    run_cli("trace-chat", source_file(FIXTURES, "NumGLUE-ds", "eval"), "--out", chat, check=True)
    model = demo_dir / "model"
    outs = {}
    for batch in (1, 2):
        outs[batch] = tmp_path / f"pred{batch}.jsonl"
        run_cli("generate", "--model", model, "--data", chat, "--out", outs[batch],
                "--max-new-tokens", "6", "--batch-size", batch, check=True)  # fmt: skip
    got = [json.loads(line)["prediction"] for line in outs[1].read_text().splitlines()]
    assert got == [json.loads(line)["prediction"] for line in outs[2].read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(model)
    reference = AutoModelForCausalLM.from_pretrained(model).eval()
    for line, answer in zip(chat.read_text().splitlines(), got, strict=True):
        messages = json.loads(line)["messages"][:-1]
        ids = list(
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        new = []
        for _ in range(6):
            with torch.no_grad():
                token = int(reference(torch.tensor([ids + new])).logits[0, -1].argmax())
            if token == tokenizer.eos_token_id:
                break
            new.append(token)
        assert answer == tokenizer.decode(new, skip_special_tokens=True)
    data = source_file(FIXTURES, "NumGLUE-ds", "eval")
    score = tmp_path / "score.json"
    run_cli("trace-score", "--task", "NumGLUE-ds", "--data", data, "--predictions", outs[1],
            "--out", score, check=True)  # fmt: skip
    assert json.loads(score.read_text())["num_samples"] == 2


def test_the_trace_config_scores_every_checkpoint_and_the_report_shows_op_and_bwt(tmp_path):
    """With `trace:`, every checkpoint's answers to every task are generated and scored (the
    trace_generate and trace_score rules; `snakemake -n` plans 328 of each for config/trace.yaml),
    the manifest lists the scores as cells, and the report shows TRACE's OP and BWT over them:
    the mean final score and the mean change since learning, here by hand."""
    import shlex

    from snakemake.utils import validate

    from mini_trainer import pipeline

    config = pipeline.read_config_file(REPO_ROOT / "config/trace.yaml")
    validate(config, str(REPO_ROOT / "workflow/schemas/config.schema.yaml"))
    scores = pipeline.trace_scores(config)
    sources = {path.split("/scores/")[1].rsplit("/", 1)[0] for path, _ in scores}
    assert len(scores) == len(sources) * 8 and "base" in sources
    assert ("results/trace/scores/sft/lr1e-05/stage8/20Minuten.json", "20Minuten") in scores
    words = shlex.split(pipeline.manifest_flags(config))
    assert words.count("--score") == len(pipeline.eval_sources(config)) * 8
    assert pipeline.manifest_inputs(config)["scores"] == [path for path, _ in scores]
    run_cli("manifest", "--out", tmp_path / "pipeline.json", *words, check=True)

    tasks = ["FOMC", "Py150", "20Minuten"]
    matrix = [[0.1, 0.2, 0.3], [0.8, 0.2, 0.3], [0.6, 0.9, 0.3], [0.5, 0.7, 0.9]]
    entries = []
    for stage, row in enumerate(matrix):
        for task, value in zip(tasks, row, strict=True):
            path = tmp_path / "scores" / str(stage) / f"{task}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"task": task, "metric": "accuracy", "score": value}))
            entries.append(
                {
                    "kind": "score",
                    "path": str(path),
                    "task": task,
                    "stage": stage,
                    "method": "sft" if stage else None,
                    "lr": 1e-5 if stage else None,
                }
            )
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"tasks": tasks, "entries": entries}))
    assert run_cli("report", "--out", tmp_path / "out", "--manifest", manifest).returncode == 0
    page = (tmp_path / "out" / "report.html").read_text()
    section = page.split('<section id="trace">')[1].split("</section>")[0]
    # OP = (0.5 + 0.7 + 0.9) / 3; BWT = ((0.5 - 0.8) + (0.7 - 0.9)) / 2
    row = r'<tr><td>sft</td><td>lr 1e-05</td><td class="num">3</td><td class="num">70.0%</td>'
    assert re.search(row + r'<td class="num">-25.0 pt</td>', section)
