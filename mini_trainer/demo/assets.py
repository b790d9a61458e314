"""`mini-trainer demo-assets`: a tiny Llama, a local BPE tokenizer and tokenized tasks.

Everything derives from one seed, so two runs give byte-identical files, and nothing is
downloaded: a new user can run the whole pipeline on a laptop CPU.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from mini_trainer.data.chat import tokenize_conversation
from mini_trainer.data.outputs import check_writable
from mini_trainer.demo.tasks import TASKS, corpus_lines, make_conversation
from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_path

SPECIAL_TOKENS = ["<|pad|>", "<|begin|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


# Kept alike on purpose: typed fields with a docstring each (as plan/model.py's counts).
@dataclass(frozen=True)
class DemoSpec:
    """Sizes of the demo; the defaults are what `demo-assets` builds."""

    seed: int = 0
    """Seeds the tokenizer corpus, the weights and the samples."""
    vocab_size: int = 384
    """BPE vocabulary, special tokens included."""
    hidden_size: int = 128
    """Model width."""
    num_layers: int = 4
    """Decoder blocks."""
    num_heads: int = 4
    """Attention heads (head size 32)."""
    num_kv_heads: int = 2
    """Key/value heads: grouped-query attention, as in current Llamas."""
    intermediate_size: int = 384
    """MLP width."""
    max_positions: int = 512
    """Longest sequence the model accepts; demo samples stay below 256 tokens."""
    train_samples: int = 2000
    """Training samples per task."""
    eval_samples: int = 200
    """Held-out samples per task."""


def build_tokenizer(spec: DemoSpec):
    """Train a byte-level BPE tokenizer on the demo corpus; return a transformers tokenizer."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(random.Random(spec.seed), 200), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|begin|>",
        eos_token="<|end|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=spec.max_positions,
    )


def build_model(spec: DemoSpec, tokenizer):
    """A randomly initialised Llama sized by `spec`, seeded for determinism."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        use_cache=False,
    )
    torch.manual_seed(spec.seed)
    return LlamaForCausalLM(config)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, separators=(",", ":")) + "\n")


def write_task_data(spec: DemoSpec, tokenizer, data_dir: Path) -> dict[str, int]:
    """Write `<task>.train.jsonl` and `<task>.eval.jsonl`; return sample counts per file."""
    counts = {}
    for task_number, task in enumerate(TASKS):
        rng = random.Random(spec.seed * 1000 + task_number + 1)
        for split, count in (("train", spec.train_samples), ("eval", spec.eval_samples)):
            rows = [
                tokenize_conversation(tokenizer, make_conversation(task, rng)).to_json_dict()
                for _ in range(count)
            ]
            _write_jsonl(data_dir / f"{task}.{split}.jsonl", rows)
            counts[f"{task}.{split}"] = count
    return counts


def build_demo_assets(
    out: Path, spec: DemoSpec | None = None, overwrite: bool = False
) -> dict[str, int]:
    """Build `out/model/` and `out/data/`; each appears complete or not at all.

    Existing folders are never replaced unless `overwrite` is set.
    """
    spec = spec or DemoSpec()
    out = Path(out)
    existing = [str(out / name) for name in ("model", "data") if (out / name).exists()]
    if existing and not overwrite:
        raise UserError(f"{existing[0]}: already exists (pass --force to replace it)")
    check_writable(out, "--out")
    tokenizer = build_tokenizer(spec)
    model = build_model(spec, tokenizer)
    hf_logging.disable_progress_bar()  # a sub-second write needs no bar
    with atomic_path(out / "model", is_dir=True) as model_dir:
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
    with atomic_path(out / "data", is_dir=True) as data_dir:
        counts = write_task_data(spec, tokenizer, data_dir)
    return counts
