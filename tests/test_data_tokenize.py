"""`mini-trainer tokenize`: loss exactly on assistant turns, clear errors, no partial output."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import run_cli

from mini_trainer.data.chat import tokenize_conversation
from mini_trainer.data.tokenize import load_chat_tokenizer, tokenize_jsonl, tokenizer_warnings
from mini_trainer.data.validate import build_index, read_vocab_size
from mini_trainer.errors import UserError

END = "<|end|>"
CONVERSATIONS = [
    [
        {"role": "system", "content": "You sort digits."},
        {"role": "user", "content": "sort: 3 1 2"},
        {"role": "assistant", "content": "1 2 3"},
        {"role": "user", "content": "reverse: 4 5 (now with é)"},
        {"role": "assistant", "content": "5 4, and é ✓!"},
    ],
    [
        {"role": "user", "content": "increment: 9"},
        {"role": "assistant", "content": "0"},
    ],
    [
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "assistant"},
        {"role": "assistant", "content": "assistant"},
    ],
]


@pytest.fixture(scope="module")
def tokenizer(demo_model):
    return load_chat_tokenizer(demo_model)


def _write_jsonl(path, records) -> None:
    path.write_text(
        "".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in records),
        encoding="utf-8",
    )


def _labelled_runs(sample: dict) -> list[list[int]]:
    """The maximal runs of consecutive positions whose label is not -100, as label lists."""
    return [labels for _, labels in _runs_with_start(sample)]


def _runs_with_start(sample: dict) -> list[tuple[int, list[int]]]:
    runs, current, start = [], [], 0
    for position, label in enumerate(sample["labels"] + [-100]):
        if label != -100:
            start = position if not current else start
            current.append(label)
        elif current:
            runs.append((start, current))
            current = []
    return runs


def test_masks_exactly_the_assistant_spans(demo_model, tokenizer, tmp_path):
    chat, out = tmp_path / "chat.jsonl", tmp_path / "tokens.jsonl"
    _write_jsonl(chat, [{"messages": m, "id": i} for i, m in enumerate(CONVERSATIONS)])
    # in a child: transformers logs to the stderr it found at import, which CliRunner misses
    result = run_cli("tokenize", chat, "--model", demo_model, "--out", out, in_process=False)
    assert "3 samples" in result.stdout
    assert "warning" not in result.stderr
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(samples) == len(CONVERSATIONS)
    for sample, messages in zip(samples, CONVERSATIONS, strict=True):
        ids, labels = sample["input_ids"], sample["labels"]
        assert sample["len"] == len(ids) == len(labels)
        assert all(label in (-100, token) for label, token in zip(labels, ids, strict=True))
        answers = [m["content"] + END for m in messages if m["role"] == "assistant"]
        runs = [tokenizer.decode(run) for run in _labelled_runs(sample)]
        assert runs == answers
        assert tokenizer.decode(ids) == tokenizer.apply_chat_template(messages, tokenize=False)
        # Each labelled run is its own turn's answer: it follows that turn's assistant header.
        header = tokenizer.convert_tokens_to_ids("<|assistant|>")
        assert [ids[start - 1] for start, _ in _runs_with_start(sample)] == [header] * len(runs)
    # What tokenize writes is what validate accepts.
    index, summary = build_index(out, read_vocab_size(demo_model), max_tokens=10_000)
    assert summary["samples"] == len(CONVERSATIONS)


def test_trailing_whitespace_after_end_of_turn_is_not_trained(tokenizer):
    """Templates like ChatML put a newline after the end-of-turn token: it gets no loss."""
    chatml = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    chatml.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    )
    messages = CONVERSATIONS[0]
    sample = tokenize_conversation(chatml, messages).to_json_dict()
    runs = [chatml.decode(run) for run in _labelled_runs(sample)]
    assert runs == [m["content"] + END for m in messages if m["role"] == "assistant"]


def test_span_not_on_token_boundaries_is_an_error(tokenizer):
    glued = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    glued.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert glued.tokenize("sort: 1")[0] == "sort"  # one token across the turn boundary below
    messages = [{"role": "user", "content": "sor"}, {"role": "assistant", "content": "t: 1"}]
    with pytest.raises(ValueError, match="token boundaries"):
        tokenize_conversation(glued, messages)


BAD = [
    # (line, FIELD, reason fragment)
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}]}\n',
     "messages[1].role", "unknown role 'bot'"),
    ('{"messages": []}\n', "messages", "empty conversation"),
    ('{"messages": [{"role": "user", "content": "hi"}]}\n', "messages", "no assistant turn"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 3}]}\n',
     "messages[1].content", "must be a string"),
    ('{"messages": [{"content": "hi"}]}\n', "messages[0].role", "missing"),
    ('{"conversation": []}\n', "messages", "missing"),
    ('{"messages": [\n', "json", "invalid JSON"),
    ('["messages"]\n', "json", "expected a JSON object"),
]  # fmt: skip


def test_each_bad_conversation_is_reported_and_nothing_written(demo_model, tmp_path):
    chat, out = tmp_path / "chat.jsonl", tmp_path / "tokens.jsonl"
    good = {"messages": CONVERSATIONS[1]}
    _write_jsonl(chat, [good] + [line for line, _, _ in BAD] + [good])
    result = run_cli("tokenize", chat, "--model", demo_model, "--out", out)
    assert result.returncode == 2
    errors = result.stderr.splitlines()
    assert len(errors) == len(BAD) + 1
    for number, (error, (_, field, reason)) in enumerate(zip(errors, BAD, strict=False), start=2):
        assert error.startswith(f"error: {chat}:{number}: {field}: "), error
        assert reason in error
    assert errors[-1] == f"error: {chat}: {len(BAD)} problems; no output written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl"]


def _model_copy(demo_model, tmp_path, edit) -> str:
    model = tmp_path / "model"
    shutil.copytree(demo_model, model)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    edit(model, config)
    config_path.write_text(json.dumps(config))
    return model


def test_tokenizer_without_chat_template(demo_model, tmp_path):
    def drop_template(model, config):
        (model / "chat_template.jinja").unlink(missing_ok=True)
        config.pop("chat_template", None)

    model = _model_copy(demo_model, tmp_path, drop_template)
    chat, out = tmp_path / "chat.jsonl", tmp_path / "tokens.jsonl"
    _write_jsonl(chat, [{"messages": CONVERSATIONS[1]}])
    result = run_cli("tokenize", chat, "--model", model, "--out", out)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {model}: the tokenizer has no chat template")
    assert not out.exists()


def test_pad_equal_to_eos_warns_and_max_len_drop_counts(demo_model, tokenizer, tmp_path):
    model = _model_copy(demo_model, tmp_path, lambda _, config: config.update(pad_token=END))
    chat, out = tmp_path / "chat.jsonl", tmp_path / "tokens.jsonl"
    _write_jsonl(chat, [{"messages": m} for m in CONVERSATIONS])
    lengths = [len(tokenize_conversation(tokenizer, m).input_ids) for m in CONVERSATIONS]
    max_len = sorted(lengths)[1]
    args = ["tokenize", chat, "--model", model, "--out", out, "--max-len", max_len]
    result = run_cli(*args, "--on-long", "drop", check=True)
    assert result.stderr.startswith("warning: the tokenizer's pad token is its eos token")
    assert "2 samples, 1 dropped" in result.stdout
    written = [json.loads(line)["len"] for line in out.read_text().splitlines()]
    assert written == [n for n in lengths if n <= max_len]


def test_max_len_is_an_error_by_default(tokenizer, tmp_path):
    chat, out = tmp_path / "chat.jsonl", tmp_path / "tokens.jsonl"
    _write_jsonl(chat, [{"messages": m} for m in CONVERSATIONS])
    with pytest.raises(UserError) as error:
        tokenize_jsonl(tokenizer, chat, out, max_len=5)
    assert error.value.lines[0].startswith(f"{chat}:1: messages: ")
    assert "--max-len 5" in error.value.lines[0]
    assert not out.exists()


def test_a_conversation_longer_than_the_tokenizer_max_is_our_line_alone(demo_model, tmp_path):
    """Beyond the tokenizer's model_max_length (512 for the demo), transformers would log its
    own "indexing errors" warning beside our --max-len line."""
    chat, out = tmp_path / "chat.jsonl", tmp_path / "tokens.jsonl"
    long = [{"role": "user", "content": "sort: " + "3 1 2 " * 400},
            {"role": "assistant", "content": "1 2 3"}]  # fmt: skip
    _write_jsonl(chat, [{"messages": long}])
    result = run_cli("tokenize", chat, "--model", demo_model, "--out", out, "--max-len", "600")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: {chat}:1: messages: ") and "--max-len 600" in lines[0]
    assert lines[1:] == [f"error: {chat}: 1 problem; no output written"], lines
    assert not out.exists()
    # in a child: transformers logs to the stderr it found at import, which CliRunner misses
    result = run_cli("tokenize", chat, "--model", demo_model, "--out", out, in_process=False)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "1 sample, 1,210 tokens" in result.stdout


def test_demo_tokenizer_has_distinct_pad_and_eos(tokenizer):
    assert tokenizer_warnings(tokenizer) == []


def test_refuses_to_overwrite_without_force(tokenizer, demo_model, tmp_path):
    chat, out = tmp_path / "chat.jsonl", tmp_path / "tokens.jsonl"
    _write_jsonl(chat, [{"messages": CONVERSATIONS[1]}])
    out.write_text("mine")
    result = run_cli("tokenize", chat, "--model", demo_model, "--out", out)
    assert result.returncode == 2 and "already exists" in result.stderr
    assert out.read_text() == "mine"


def test_template_that_refuses_a_conversation_is_a_line_error(tokenizer, tmp_path):
    strict = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    strict.chat_template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        + tokenizer.chat_template
    )
    chat, out = tmp_path / "chat.jsonl", tmp_path / "tokens.jsonl"
    _write_jsonl(chat, [{"messages": m} for m in CONVERSATIONS])
    with pytest.raises(UserError) as error:
        tokenize_jsonl(strict, chat, out)
    assert error.value.lines[0].startswith(f"{chat}:1: messages: the chat template refused it")
    assert "no system role" in error.value.lines[0]
    assert len(error.value.lines) == 2 and not out.exists()
