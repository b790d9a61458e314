"""Foundation: CLI surface and the embedded demo assets."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import run_cli

from mini_trainer import __version__
from mini_trainer.demo.tasks import TASKS


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_cli_help_lists_subcommands():
    from mini_trainer.cli import cli

    result = run_cli("--help", check=True)
    listed = result.stdout.split("Commands:")[1]
    assert {"demo-assets", "validate", "tokenize", "train"} <= set(cli.commands)
    for name in cli.commands:
        assert f"  {name} " in listed, name
    assert run_cli("--version", check=True).stdout.strip().endswith(__version__)


def test_every_subcommand_has_help():
    from mini_trainer.cli import cli

    assert cli.commands, "no subcommands registered"
    for name in cli.commands:
        result = run_cli(name, "--help")
        assert result.returncode == 0, (name, result.stderr)
        assert "Usage" in result.stdout or "usage" in result.stdout, name


def test_demo_assets_are_deterministic(demo_dir, tmp_path):
    run_cli("demo-assets", "--out", tmp_path, check=True)
    first, second = _files(demo_dir), _files(tmp_path)
    assert first.keys() == second.keys()
    assert len(first) >= 8
    for name in first:
        assert first[name] == second[name], f"{name} differs between two runs"


def test_demo_assets_other_seed_differs(demo_dir, tmp_path):
    run_cli("demo-assets", "--out", tmp_path, "--seed", "1", check=True)
    assert (tmp_path / "data/sort.train.jsonl").read_bytes() != (
        demo_dir / "data/sort.train.jsonl"
    ).read_bytes()


def test_demo_assets_refuses_to_overwrite(demo_dir, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.txt").write_text("keep me")
    result = run_cli("demo-assets", "--out", tmp_path)
    assert result.returncode == 2
    assert "already exists" in result.stderr
    assert (tmp_path / "model" / "mine.txt").read_text() == "keep me"
    assert not (tmp_path / "data").exists()


def test_model_and_tokenizer_load(demo_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_model)
    model = AutoModelForCausalLM.from_pretrained(demo_model)
    assert model.config.model_type == "llama"
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    assert tokenizer.chat_template
    assert len(tokenizer) == model.config.vocab_size
    ids = torch.tensor([tokenizer("sort: 3 1 2")["input_ids"]])
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)


@pytest.mark.parametrize("task", list(TASKS))
def test_task_data_is_well_formed(demo_dir, demo_model, task):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_model)
    vocab = len(tokenizer)
    for split, expected in (("train", 2000), ("eval", 200)):
        lines = (demo_dir / "data" / f"{task}.{split}.jsonl").read_text().splitlines()
        assert len(lines) == expected
        lengths = []
        for line in lines:
            row = json.loads(line)
            ids, labels = row["input_ids"], row["labels"]
            assert row["len"] == len(ids) == len(labels)
            assert all(0 <= t < vocab for t in ids)
            # Labels mask exactly the prompt: -100 up to the assistant header, then the ids.
            header = ids.index(tokenizer.convert_tokens_to_ids("<|assistant|>"))
            assert all(label == -100 for label in labels[: header + 1])
            assert labels[header + 1 :] == ids[header + 1 :]
            assert ids[-1] == tokenizer.eos_token_id
            prompt = tokenizer.decode(ids[1 : header - 1])
            answer = tokenizer.decode(labels[header + 1 : -1])
            assert prompt.startswith(f"{task}: ")
            digits = [int(d) for d in prompt.split(": ", 1)[1].split()]
            assert [int(d) for d in answer.split()] == TASKS[task](digits)
            lengths.append(len(ids))
        # A long tail: the longest sample is several times the median.
        lengths.sort()
        assert lengths[-1] >= 4 * lengths[len(lengths) // 2]
