"""`mini-trainer tokenize`: chat JSONL to pre-tokenized JSONL with the model's chat template.

Input lines are `{"messages": [{"role": ..., "content": ...}, ...]}` (other keys ignored);
output lines are `{"input_ids": [...], "labels": [...], "len": N}` with loss on assistant turns
only (see `chat.tokenize_conversation`). Every bad line is reported as `FILE:LINE: FIELD: reason`;
any problem means no output file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from jinja2 import TemplateError

from mini_trainer.data.chat import tokenize_conversation
from mini_trainer.data.checks import describe, parse_json_line
from mini_trainer.data.lines import iter_lines
from mini_trainer.data.problems import ProblemLog
from mini_trainer.data.validate import ON_LONG
from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_path
from mini_trainer.labels import count_loss_tokens


@dataclass(frozen=True)
class TokenizeResult:
    """What `tokenize_jsonl` wrote."""

    samples: int
    """Lines written."""
    dropped: int
    """Conversations longer than `max_len` left out (only with `on_long="drop"`)."""
    tokens: int
    """Tokens written."""
    loss_tokens: int
    """Labels other than -100 at positions t >= 1, over all samples written."""


def load_chat_tokenizer(model_path: str | os.PathLike):
    """The model folder's tokenizer; `UserError` if it is missing or has no chat template."""
    # deferred: transformers (~2 s); the CLI imports this module for every command
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    except (OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise UserError(f"{model_path}: cannot load a tokenizer: {first_line}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            f"{model_path}: the tokenizer has no chat template "
            "(add chat_template.jinja to the model folder, or use a chat model's tokenizer)"
        )
    return tokenizer


def tokenizer_warnings(tokenizer) -> list[str]:
    """Things about the tokenizer that are legal but usually a mistake."""
    warnings = []
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id == tokenizer.eos_token_id:
        warnings.append(
            f"the tokenizer's pad token is its eos token {tokenizer.eos_token!r}: tools that mask "
            "padding by token id also mask every eos, and the model never learns to stop "
            "(the labels written here keep the end-of-turn token)"
        )
    return warnings


def _messages_of(raw: bytes) -> tuple[object, tuple[str, str] | None]:
    record, problem = parse_json_line(raw)
    if problem:
        return None, problem
    if not isinstance(record, dict):
        return None, ("json", f"expected a JSON object, got {describe(record)}")
    if "messages" not in record:
        return None, ("messages", "missing")
    return record["messages"], None


def _split_problem(message: str) -> tuple[str, str]:
    """`chat` raises `FIELD: reason` for conversation problems, plain reasons for template ones."""
    head, sep, tail = message.partition(": ")
    if sep and head.startswith("messages"):
        return head, tail
    return "messages", message


def tokenize_jsonl(
    tokenizer,
    in_path: str | os.PathLike,
    out_path: str | os.PathLike,
    max_len: int | None = None,
    on_long: str = "error",
    progress: bool | None = None,
    vocab_size: int | None = None,
) -> TokenizeResult:
    """Tokenize every conversation of `in_path` into `out_path`, atomically.

    A conversation longer than `max_len` tokens is an error, or left out and counted when
    `on_long` is "drop" (never truncated: that would cut the answer). `UserError` lists every
    problem, and then `out_path` is not written. With `vocab_size` (the model's), a token id
    the model has no embedding for is an error too, so the output always passes `validate`.
    """
    if on_long not in ON_LONG:
        raise ValueError(f"on_long must be one of {ON_LONG}, got {on_long!r}")
    log = ProblemLog(str(in_path))
    samples = dropped = tokens = loss_tokens = lines = 0
    with atomic_path(out_path) as tmp, open(tmp, "w", encoding="utf-8") as out:
        for number, _offset, raw in iter_lines(in_path, progress):
            lines = number
            messages, problem = _messages_of(raw)
            if problem:
                log.add(number, *problem)
                continue
            try:
                sample = tokenize_conversation(tokenizer, messages)
            except ValueError as error:
                log.add(number, *_split_problem(str(error)))
                continue
            except TemplateError as error:  # e.g. "roles must alternate user/assistant"
                log.add(number, "messages", f"the chat template refused it: {error}")
                continue
            length = len(sample.input_ids)
            if vocab_size is not None and max(sample.input_ids) >= vocab_size:
                log.add(
                    number,
                    "messages",
                    f"token id {max(sample.input_ids)} is outside the model's vocabulary "
                    f"(0..{vocab_size - 1}): the tokenizer and the model do not match",
                )
                continue
            if max_len is not None and length > max_len:
                if on_long == "error":
                    log.add(
                        number,
                        "messages",
                        f"{length} tokens, more than --max-len {max_len} "
                        "(use --on-long drop to leave such conversations out)",
                    )
                else:
                    dropped += 1
                continue
            sample_loss = count_loss_tokens(sample.labels)
            if sample_loss == 0:
                log.add(number, "messages", "no loss token after the causal shift")
                continue
            if not log.count:
                out.write(json.dumps(sample.to_json_dict(), separators=(",", ":")) + "\n")
            samples += 1
            tokens += length
            loss_tokens += sample_loss
        if lines == 0:
            log.add_file_problem("empty file (no conversations)")
        elif not log.count and samples == 0:
            log.add_file_problem(f"no conversation left: all {dropped} are longer than {max_len}")
        log.raise_if_any("no output written")
    return TokenizeResult(samples=samples, dropped=dropped, tokens=tokens, loss_tokens=loss_tokens)
