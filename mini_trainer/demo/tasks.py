"""Synthetic tasks whose answer is a deterministic function of the prompt.

Each task maps a digit sequence to another; prompts carry the task's own prefix so one model can
learn several tasks (and forget them, which is what OSFT is for). The tasks are chosen so that
the tiny demo model learns each in a few hundred CPU steps: their answers depend on the digit
counts of the prompt, not on copying positions (reversing or copying digit by digit takes a
model this small thousands of steps), and they conflict with each other (the same prompt digits
in another order), so training on one visibly disturbs the others. Sequence lengths follow a
clipped log-normal law, so a few samples are many times longer than the median: packing matters.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

MIN_DIGITS = 2
MAX_DIGITS = 96


def _sort(digits: list[int]) -> list[int]:
    return sorted(digits)


def _sort_desc(digits: list[int]) -> list[int]:
    return sorted(digits, reverse=True)


def _sort_plus1(digits: list[int]) -> list[int]:
    return sorted((d + 1) % 10 for d in digits)


TASKS: dict[str, Callable[[list[int]], list[int]]] = {
    "sort": _sort,
    "sort_desc": _sort_desc,
    "sort_plus1": _sort_plus1,
}


def sample_length(rng: random.Random) -> int:
    """A long-tailed digit count: median about 10, clipped to [MIN_DIGITS, MAX_DIGITS]."""
    n = int(round(math.exp(rng.gauss(math.log(10.0), 0.75))))
    return max(MIN_DIGITS, min(MAX_DIGITS, n))


def make_conversation(task: str, rng: random.Random) -> list[dict]:
    """One user/assistant exchange for `task`."""
    digits = [rng.randrange(10) for _ in range(sample_length(rng))]
    prompt = f"{task}: " + " ".join(map(str, digits))
    answer = " ".join(map(str, TASKS[task](digits)))
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


def corpus_lines(rng: random.Random, count: int) -> list[str]:
    """Text to train the tokenizer on: prompts and answers of every task."""
    lines = []
    for _ in range(count):
        for task in TASKS:
            for message in make_conversation(task, rng):
                lines.append(message["content"])
    return lines
