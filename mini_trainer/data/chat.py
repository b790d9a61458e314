"""Chat conversations to `input_ids`/`labels` with loss on assistant turns only.

The conversation is rendered once with the tokenizer's chat template and tokenized with offsets.
Each assistant turn's character span (its content up to the end of its turn, so the end-of-turn
token is included, but not the whitespace some templates put after it) is found by rendering
growing prefixes of the conversation; tokens that start inside such a span get their own id as
label, all others -100. This works for any template whose turns are rendered in order, without
the template having to mark generation spans. A span that does not begin and end on token
boundaries is an error rather than a silently shifted mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mini_trainer.labels import IGNORE_INDEX

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
    """Return `FIELD: reason` saying why `messages` is not a usable conversation, or None.

    FIELD is a path such as `messages[1].role`, so callers can prefix it with `FILE:LINE: `.
    """
    if not isinstance(messages, list):
        return "messages: must be a list of {role, content} objects"
    if not messages:
        return "messages: empty conversation"
    for i, message in enumerate(messages):
        field = f"messages[{i}]"
        if not isinstance(message, dict):
            return f"{field}: must be an object with role and content"
        role = message.get("role")
        if role is None:
            return f"{field}.role: missing"
        if role not in ROLES:
            return f"{field}.role: unknown role {role!r} (expected one of {', '.join(ROLES)})"
        content = message.get("content")
        if not isinstance(content, str):
            return f"{field}.content: must be a string"
        if role == "assistant" and not content:
            return f"{field}.content: empty assistant message (nothing to train on)"
    if not any(m["role"] == "assistant" for m in messages):
        return "messages: no assistant turn (nothing to train on)"
    return None


def _render(tokenizer, messages: Sequence[dict]) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False)


def assistant_char_spans(tokenizer, messages: Sequence[dict]) -> tuple[str, list[tuple[int, int]]]:
    """Render `messages`; return the text and the [start, end) spans that carry loss.

    A span runs from the assistant content to the end of its turn as rendered, less trailing
    whitespace (for example the newline after `<|im_end|>`), but never shorter than the content.
    """
    text = _render(tokenizer, messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = len(_render(tokenizer, messages[:i])) if i else 0
        prefix = _render(tokenizer, messages[: i + 1])
        through = len(prefix)
        if text[:through] != prefix:
            raise ValueError("the chat template does not render conversations prefix by prefix")
        # rfind: the content is the last thing of its turn but the end-of-turn marker, while
        # the same string may also occur earlier in the header (content "assistant").
        start = text.rfind(message["content"], before, through)
        if start < 0:
            raise ValueError(f"assistant message {i} is not rendered verbatim by the chat template")
        content_end = start + len(message["content"])
        end = max(content_end, len(text[:through].rstrip()))
        spans.append((start, end))
    return text, spans


def tokenize_conversation(tokenizer, messages: Sequence[dict]) -> TokenizedSample:
    """Tokenize one conversation; loss on assistant content and its end-of-turn token.

    Raises ValueError (message `FIELD: reason` or a plain reason) for an unusable conversation.
    """
    problem = check_messages(messages)
    if problem:
        raise ValueError(problem)
    text, spans = assistant_char_spans(tokenizer, messages)
    # verbose=False: no "will result in indexing errors" warning beyond the tokenizer's
    # model_max_length; the length rule is the caller's (--max-len), reported in its own line.
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    input_ids = list(encoding["input_ids"])
    offsets = encoding["offset_mapping"]
    labels = [IGNORE_INDEX] * len(input_ids)
    position = 0
    for turn, (span_start, span_end) in enumerate(spans):
        while position < len(offsets) and offsets[position][0] < span_start:
            position += 1
        first = position
        while position < len(offsets) and offsets[position][0] < span_end:
            labels[position] = input_ids[position]
            position += 1
        starts_on_boundary = first < len(offsets) and offsets[first][0] == span_start
        ends_on_boundary = position > first and offsets[position - 1][1] == span_end
        if not (starts_on_boundary and ends_on_boundary):
            raise ValueError(
                f"assistant turn {turn + 1} does not start and end on token boundaries "
                "(the tokenizer merges it with neighbouring text): its loss mask would be inexact"
            )
    return TokenizedSample(input_ids=input_ids, labels=labels)
