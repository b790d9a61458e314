"""`mini-trainer evaluate` against an independent reference: plain per-sample transformers.

The reference below uses no mini_trainer code: it loads the folder with AutoModelForCausalLM,
runs each sample alone, takes logits[t] against labels[t + 1] and counts by hand. Our numbers
come from packed rows, FSDP2 (one or two real ranks) and chunked logits, so agreement checks the
planner, the collator's shift, the sample isolation and the chunked statistics together.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from helpers import REPO_ROOT, run_cli, subprocess_env

from mini_trainer.training.eval_stats import chunked_eval_stats, sample_ids_of

IGNORE = -100


def reference_metrics(model_dir, samples) -> dict:
    """Loss, accuracy, exact match by plain per-sample forwards (fp64 sums)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    loss_sum, correct, tokens, exact = 0.0, 0, 0, 0
    with torch.no_grad():
        for sample in samples:
            ids = torch.tensor([sample["input_ids"]])
            labels = torch.tensor(sample["labels"])
            logits = model(input_ids=ids).logits[0].double()
            shift_logits, shift_labels = logits[:-1], labels[1:]
            mask = shift_labels != IGNORE
            losses = torch.nn.functional.cross_entropy(
                shift_logits[mask], shift_labels[mask], reduction="none"
            )
            right = shift_logits[mask].argmax(-1) == shift_labels[mask]
            loss_sum += losses.sum().item()
            correct += int(right.sum())
            tokens += int(mask.sum())
            exact += bool(right.all())
    return {
        "loss": loss_sum / tokens,
        "token_accuracy": correct / tokens,
        "exact_match": exact / len(samples),
        "num_loss_tokens": tokens,
        "num_correct_tokens": correct,
        "num_exact_samples": exact,
    }


def greedy_labels(model, sample) -> list[int]:
    """The sample's labels replaced, on answer positions, by the model's own arg-max tokens."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([sample["input_ids"]])).logits[0]
    predicted = logits.argmax(-1).tolist()
    labels = list(sample["labels"])
    for t in range(1, len(labels)):
        if labels[t] != IGNORE:
            labels[t] = predicted[t - 1]
    return labels


@pytest.fixture(scope="module")
def eval_set(demo_dir, tmp_path_factory):
    """60 demo samples; every third one relabelled with the model's own predictions.

    Those are answered exactly right, so exact match and accuracy are far from 0 and a wrong
    shift or a leak between packed samples would change them.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_dir / "model", dtype=torch.float32).eval()
    lines = (demo_dir / "data" / "sort_desc.eval.jsonl").read_text().splitlines()[:60]
    samples = [json.loads(line) for line in lines]
    for i in range(0, len(samples), 3):
        samples[i]["labels"] = greedy_labels(model, samples[i])
    path = tmp_path_factory.mktemp("eval") / "mixed.eval.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    return path, samples


def assert_matches_reference(result: dict, reference: dict, samples) -> None:
    assert result["num_samples"] == len(samples)
    assert result["num_tokens"] == sum(len(s["input_ids"]) for s in samples)
    for key in ("num_loss_tokens", "num_correct_tokens", "num_exact_samples"):
        assert result[key] == reference[key], key
    assert result["token_accuracy"] == reference["token_accuracy"]
    assert result["exact_match"] == reference["exact_match"]
    assert math.isclose(result["loss"], reference["loss"], rel_tol=1e-5)
    assert math.isclose(result["perplexity"], math.exp(reference["loss"]), rel_tol=1e-5)
    assert reference["exact_match"] >= 1 / 3  # the relabelled samples, at least


def test_chunked_stats_equal_full_logits_for_any_chunk_size():
    torch.manual_seed(0)
    hidden = torch.randn(23, 8, dtype=torch.float64)
    weight = torch.randn(11, 8, dtype=torch.float64)
    lengths = [5, 9, 1, 8]
    sample_ids = sample_ids_of(lengths)
    logits = hidden @ weight.T
    targets = logits.argmax(-1).clone()  # all right ...
    targets[[2, 10]] = (targets[[2, 10]] + 1) % 11  # ... but for sample 0 and sample 1
    targets[[0, 13, 14, 22]] = IGNORE
    mask = targets != IGNORE
    expected_loss = torch.nn.functional.cross_entropy(
        logits[mask], targets[mask], reduction="sum"
    ).item()
    for chunk_size in (1, 3, 7, 1000):
        sums = chunked_eval_stats(hidden, weight, targets, sample_ids, 4, chunk_size=chunk_size)
        assert math.isclose(sums.loss_sum.item(), expected_loss, rel_tol=1e-12)
        assert sums.num_loss_tokens == int(mask.sum()) == 19
        assert sums.num_correct == 17
        assert sums.sample_all_correct.tolist() == [False, False, True, True]


def test_single_process_equals_per_sample_transformers(demo_dir, eval_set, tmp_path):
    path, samples = eval_set
    out = tmp_path / "metrics.json"
    result = run_cli(
        "evaluate", "--model", demo_dir / "model", "--data", path, "--out", out,
        "--max-tokens-per-gpu", 300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    metrics = json.loads(out.read_text())
    assert metrics["world_size"] == 1 and metrics["num_micro_batches"] > 3  # really packed
    assert_matches_reference(metrics, reference_metrics(demo_dir / "model", samples), samples)
    for key in ("model", "data", "versions", "timestamp"):
        assert key in metrics
    # Its lines, each once: the summary and the file written on stdout, nothing repeated on
    # stderr (run_cli shows the command's log lines as a child process has them).
    summary, wrote = result.stdout.splitlines()
    assert "token accuracy" in summary and wrote == f"wrote {out}"
    assert "wrote" not in result.stderr, result.stderr
    # An existing output is kept unless --force.
    again = run_cli("evaluate", "--model", demo_dir / "model", "--data", path, "--out", out)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_several_files_in_one_run_equal_one_run_each(demo_dir, eval_set, tmp_path):
    """`--data A --out a --data B --out b` loads the model once and writes what two runs write."""
    path, _ = eval_set
    other = tmp_path / "other.eval.jsonl"  # 40 samples of another task
    lines = (demo_dir / "data" / "sort.eval.jsonl").read_text().splitlines(keepends=True)
    other.write_text("".join(lines[:40]))
    model = demo_dir / "model"
    result = run_cli(
        "evaluate", "--model", model, "--data", path, "--out", tmp_path / "a.json",
        "--data", other, "--out", tmp_path / "b.json", "--max-tokens-per-gpu", 300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("wrote ") == 2
    for data, name in ((path, "a"), (other, "b")):
        alone = tmp_path / f"{name}-alone.json"
        single = run_cli("evaluate", "--model", model, "--data", data, "--out", alone,
                         "--max-tokens-per-gpu", 300)  # fmt: skip
        assert single.returncode == 0, single.stderr
        together = json.loads((tmp_path / f"{name}.json").read_text())
        apart = json.loads(alone.read_text())
        assert together["data"] == str(data)
        for key in ("loss", "token_accuracy", "exact_match", "num_samples", "num_loss_tokens"):
            assert together[key] == apart[key], key


def test_several_files_are_all_checked_before_any_is_written(demo_dir, eval_set, tmp_path):
    path, _ = eval_set
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2], "labels": [-100, 2]}\nnot json\n')
    model = demo_dir / "model"
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    result = run_cli("evaluate", "--model", model, "--data", path, "--out", outs[0],
                     "--data", bad, "--out", outs[1])  # fmt: skip
    assert result.returncode == 2 and f"{bad}:2:" in result.stderr, result.stderr
    assert not any(out.exists() for out in outs)
    unpaired = run_cli("evaluate", "--model", model, "--data", path, "--data", bad,
                       "--out", outs[0])  # fmt: skip
    assert unpaired.returncode == 2
    assert "error: --data and --out come in pairs: 2 --data, 1 --out" in unpaired.stderr
    same = run_cli("evaluate", "--model", model, "--data", path, "--out", outs[0],
                   "--data", path, "--out", outs[0])  # fmt: skip
    assert same.returncode == 2 and "are the same file" in same.stderr
    assert not any(out.exists() for out in outs)
    # Samples over the cap: the remedy evaluate has (validate's --on-long drop is not one).
    capped = run_cli("evaluate", "--model", model, "--data", path, "--out", outs[0],
                     "--max-tokens-per-gpu", 8)  # fmt: skip
    assert capped.returncode == 2 and f"{path}:1: input_ids: " in capped.stderr
    last = capped.stderr.splitlines()[-1]
    assert "raise --max-tokens-per-gpu" in last and "--on-long" not in capped.stderr, last
    assert not outs[0].exists()


@pytest.mark.slow
def test_two_ranks_under_torchrun_equal_per_sample_transformers(demo_dir, eval_set, tmp_path):
    path, samples = eval_set
    out = tmp_path / "metrics.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "mini_trainer", "evaluate", "--model", str(demo_dir / "model"),
        "--data", str(path), "--out", str(out), "--max-tokens-per-gpu", "300",
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, env=subprocess_env(), cwd=REPO_ROOT, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(out.read_text())
    assert metrics["world_size"] == 2
    assert_matches_reference(metrics, reference_metrics(demo_dir / "model", samples), samples)
    assert (result.stdout + result.stderr).count("wrote ") == 1  # rank 0 alone, once


def _bad_input_run(demo_dir, tmp_path, data_text=None, model=None):
    data = tmp_path / "bad.jsonl"
    data.write_text(data_text if data_text is not None else "")
    out = tmp_path / "out.json"
    result = run_cli(
        "evaluate", "--model", model or demo_dir / "model", "--data", data, "--out", out
    )
    assert result.returncode == 2, result.stderr
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.jsonl"]  # no temporary left either
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert error_lines and "Traceback" not in result.stderr
    return error_lines, data


def test_missing_model_is_a_one_line_error(demo_dir, tmp_path):
    good = (demo_dir / "data" / "sort.eval.jsonl").read_text().splitlines()[0] + "\n"
    lines, _ = _bad_input_run(demo_dir, tmp_path, good, model=tmp_path / "nope")
    assert lines == [f"error: {tmp_path / 'nope'}: --model: no such model folder"]


def test_bad_jsonl_line_and_token_outside_vocab_name_file_line_and_field(demo_dir, tmp_path):
    good = (demo_dir / "data" / "sort.eval.jsonl").read_text().splitlines()[:3]
    sample = json.loads(good[1])
    sample["input_ids"][3] = 384  # the demo vocabulary has 384 tokens: ids 0..383
    text = "\n".join([good[0], json.dumps(sample), "{not json", good[2]]) + "\n"
    lines, data = _bad_input_run(demo_dir, tmp_path, text)
    assert any(line.startswith(f"error: {data}:2: input_ids") and "384" in line for line in lines)
    assert any(line.startswith(f"error: {data}:3: ") for line in lines)
    assert lines[-1] == f"error: {data}: 2 problems"  # evaluate writes no index: none promised


def test_one_bad_line_is_one_line(demo_dir, tmp_path):
    good = (demo_dir / "data" / "sort.eval.jsonl").read_text().splitlines()[:2]
    text = "\n".join([good[0], "{not json", good[1]]) + "\n"
    lines, data = _bad_input_run(demo_dir, tmp_path, text)
    assert len(lines) == 1 and lines[0].startswith(f"error: {data}:2: json: "), lines


LOCAL_TASK = """\
task: demo_sort_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{prompt}}}}"
doc_to_choice: choices
doc_to_target: gold
metric_list:
  - metric: acc
"""


def test_lm_eval_task_defined_locally_runs_offline(demo_dir, tmp_path):
    pytest.importorskip("lm_eval", reason="lm_eval is not installed (pip install '.[eval]')")
    docs = [
        {"prompt": "<|user|>sort: 3 1 2<|end|><|assistant|>", "choices": ["1 2 3", "3 2 1"],
         "gold": 0},
        {"prompt": "<|user|>sort_desc: 3 1 2<|end|><|assistant|>", "choices": ["1 2 3", "3 2 1"],
         "gold": 1},
        {"prompt": "<|user|>sort: 5 4<|end|><|assistant|>", "choices": ["4 5", "5 4"], "gold": 0},
    ]  # fmt: skip
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "choice.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tasks / "demo_sort_choice.yaml").write_text(LOCAL_TASK.format(data=tasks / "choice.jsonl"))
    data = demo_dir / "data" / "sort.eval.jsonl"
    out = tmp_path / "metrics.json"
    result = subprocess.run(
        [sys.executable, "-m", "mini_trainer", "evaluate", "--model", str(demo_dir / "model"),
         "--data", str(data), "--out", str(out), "--lm-eval-tasks", "demo_sort_choice",
         "--lm-eval-include", str(tasks)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=600,
        env=subprocess_env(HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf")),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(out.read_text())
    task = metrics["lm_eval"]["demo_sort_choice"]
    assert task["num_samples"] == 3
    assert task["acc,none"] in (0.0, 1 / 3, 2 / 3, 1.0)
    assert "lm-eval demo_sort_choice" in result.stdout
    # A missing task folder is a one-line error before any work, and no output. (An unknown
    # task name is the same kind of error, but finding out indexes the harness's ~15,000 task
    # files, half a minute, so it is not repeated here.)
    missing = tmp_path / "missing.json"
    bad = run_cli(
        "evaluate", "--model", demo_dir / "model", "--data", data, "--out", missing,
        "--lm-eval-tasks", "demo_sort_choice", "--lm-eval-include", tmp_path / "nowhere",
    )  # fmt: skip
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.splitlines() == [
        f"error: {tmp_path / 'nowhere'}: --lm-eval-include: no such folder"
    ]
    assert not missing.exists()


def test_missing_lm_eval_names_the_extra(monkeypatch):
    from mini_trainer.errors import UserError
    from mini_trainer.evaluate.lm_eval_tasks import import_lm_eval, parse_task_list

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # what Python does when it is absent
    with pytest.raises(UserError) as caught:
        import_lm_eval()
    assert caught.value.lines[0].startswith("--lm-eval-tasks: lm_eval is not installed")
    assert "pip install 'mini-trainer[eval]'" in caught.value.lines[0]
    assert parse_task_list(" a, b ") == ["a", "b"]
    with pytest.raises(UserError, match="empty task name"):
        parse_task_list("a,,b")
