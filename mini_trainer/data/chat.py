"""Chat conversations to `input_ids`/`labels` with loss on assistant turns only.

The conversation is rendered once with the tokenizer's chat template and tokenized with offsets.
Each assistant turn's character span (its content up to the end of its turn, so the end-of-turn
token is included) is found by rendering growing prefixes of the conversation; tokens that start
inside such a span get their own id as label, all others -100. This works for any template whose
turns are rendered in order, without the template having to mark generation spans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

IGNORE_INDEX = -100
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class TokenizedSample:
    """One pre-tokenized training sample."""

    input_ids: list[int]
    """Token ids of the whole rendered conversation."""
    labels: list[int]
    """Same length as `input_ids`; -100 where no loss is taken."""

    def to_json_dict(self) -> dict:
        return {"input_ids": self.input_ids, "labels": self.labels, "len": len(self.input_ids)}


def check_messages(messages: object) -> str | None:
    """Return why `messages` is not a usable conversation, or None when it is."""
    if not isinstance(messages, list):
        return "must be a list of {role, content} objects"
    if not messages:
        return "empty conversation"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"message {i} is not an object"
        role = message.get("role")
        if role not in ROLES:
            return f"message {i}: unknown role {role!r} (expected one of {', '.join(ROLES)})"
        if not isinstance(message.get("content"), str):
            return f"message {i}: content must be a string"
    if not any(m["role"] == "assistant" for m in messages):
        return "no assistant turn (nothing to train on)"
    return None


def _render(tokenizer, messages: Sequence[dict]) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False)


def assistant_char_spans(tokenizer, messages: Sequence[dict]) -> tuple[str, list[tuple[int, int]]]:
    """Render `messages`; return the text and the [start, end) spans that carry loss."""
    text = _render(tokenizer, messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = len(_render(tokenizer, messages[:i])) if i else 0
        through = len(_render(tokenizer, messages[: i + 1]))
        if text[:through] != _render(tokenizer, messages[: i + 1]):
            raise ValueError("the chat template does not render conversations prefix by prefix")
        start = text.find(message["content"], before, through)
        if start < 0:
            raise ValueError(f"assistant message {i} is not rendered verbatim by the chat template")
        spans.append((start, through))
    return text, spans


def tokenize_conversation(tokenizer, messages: Sequence[dict]) -> TokenizedSample:
    """Tokenize one conversation; loss on assistant content and its end-of-turn token."""
    problem = check_messages(messages)
    if problem:
        raise ValueError(problem)
    text, spans = assistant_char_spans(tokenizer, messages)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    input_ids = list(encoding["input_ids"])
    labels = [IGNORE_INDEX] * len(input_ids)
    span_iter = iter(spans)
    span = next(span_iter, None)
    for position, (start, _end) in enumerate(encoding["offset_mapping"]):
        while span is not None and start >= span[1]:
            span = next(span_iter, None)
        if span is None:
            break
        if span[0] <= start < span[1]:
            labels[position] = input_ids[position]
    return TokenizedSample(input_ids=input_ids, labels=labels)
