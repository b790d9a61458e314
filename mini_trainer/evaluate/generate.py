"""`mini-trainer generate`: a checkpoint's answers to chat prompts, for metrics on generated text
(TRACE's, `trace_metrics.py`), one process (a GPU when there is one).

Each chat line's prompt is every message but its last assistant turn, rendered with the model's
chat template and the generation prompt; the answer is decoded greedily (TRACE samples at a low
temperature; greedy makes a score repeatable) up to `max_new_tokens` or the end of the turn, and
written as `{"prediction": text}` on the same line number. Batches are left-padded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mini_trainer.data.chat import check_messages
from mini_trainer.data.lines import iter_lines
from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_path


def read_prompts(path: str | os.PathLike) -> list[list[dict]]:
    """The prompt messages of each chat line (its final assistant turn left out), or a
    UserError naming each bad line as `FILE:LINE: FIELD: reason`."""
    prompts, problems = [], []
    for number, _, line in iter_lines(path):
        try:
            messages = json.loads(line).get("messages")
        except (ValueError, AttributeError):
            problems.append(f"{path}:{number}: not a JSON object")
            continue
        problem = check_messages(messages)
        if problem:
            problems.append(f"{path}:{number}: {problem}")
            continue
        if messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        if not messages:
            problems.append(f"{path}:{number}: messages: nothing before the answer")
            continue
        prompts.append(messages)
    if problems:
        raise UserError(*problems)
    return prompts


def read_predictions(path: str | os.PathLike) -> list[str]:
    """The `prediction` strings of a file `write_predictions` wrote (the input of `trace-score`),
    or a UserError naming each bad line."""
    generated, problems = [], []
    for number, _, line in iter_lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append(f"{path}:{number}: not JSON: {error.msg}")
            continue
        value = record.get("prediction") if isinstance(record, dict) else None
        if not isinstance(value, str):
            problems.append(f"{path}:{number}: prediction: must be a string")
            continue
        generated.append(value)
    if problems:
        raise UserError(*problems)
    return generated


def generate_answers(
    model_path: str | os.PathLike, prompts: list[list[dict]], max_new_tokens: int, batch_size: int
) -> list[str]:
    """Greedy answers of the model to each prompt (bf16 on a GPU, fp32 on the CPU)."""
    # deferred: torch, transformers (the CLI imports this module for every command)
    import torch
    from transformers import AutoModelForCausalLM

    from mini_trainer.data.tokenize import load_chat_tokenizer

    tokenizer = load_chat_tokenizer(model_path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype).to(device).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stops = [tokenizer.eos_token_id, model.generation_config.eos_token_id]
    stops = [i for i in stops if i is not None]
    answers = []
    for start in range(0, len(prompts), batch_size):
        encoded = [
            list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"])
            for messages in prompts[start : start + batch_size]
        ]  # fmt: skip
        width = max(len(ids) for ids in encoded)
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in encoded], device=device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in encoded], device=device)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                do_sample=False, pad_token_id=pad, eos_token_id=_flatten(stops),
            )  # fmt: skip
        answers += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return answers


def _flatten(ids: list) -> list[int]:
    flat = []
    for item in ids:
        flat += item if isinstance(item, list) else [item]
    return sorted(set(flat))


def write_predictions(out: str | os.PathLike, answers: list[str]) -> None:
    """`{"prediction": text}` per line, published whole or not at all."""
    with atomic_path(Path(out)) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for answer in answers:
            handle.write(json.dumps({"prediction": answer}, ensure_ascii=False) + "\n")
