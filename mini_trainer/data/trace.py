"""TRACE (arXiv:2310.06762): its eight tasks, its file layout, and its samples as chat JSONL.

TRACE's own repository (BeyonderXX/TRACE, read at commit `SOURCE_COMMIT`) publishes the processed
benchmark as one archive (`LLM-CL_Benchmark`, a Google Drive link in its README), not on the
Hugging Face Hub. Its layout, which `utils/data/raw_datasets.py` (`LocalJsonFileDataset`)
reads: `<root>/<task>/{train,eval,test}.json`, each one JSON array of `{"prompt", "answer"}`.

The prompt format is already in the data: every `prompt` begins with the task's instruction
(`INSTRUCTIONS`, TRACE's `TASK_PROMT` in `inference/ICL.py`), and TRACE trains on `prompt +
answer` and generates from `prompt`. As chat, a sample is one user turn (the prompt, verbatim)
and one assistant turn (the answer, verbatim): the loss falls on the answer, as in TRACE, and
the model's own chat template frames the two.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_path

SOURCE_REPOSITORY = "https://github.com/BeyonderXX/TRACE"
SOURCE_COMMIT = "462e39f616134f4f819efeb3baea8638c03c7db4"
"""The commit of TRACE's repository whose data layout, prompts and metrics this follows."""

TASKS = (
    "C-STANCE",
    "FOMC",
    "MeetingBank",
    "Py150",
    "ScienceQA",
    "NumGLUE-cm",
    "NumGLUE-ds",
    "20Minuten",
)
"""TRACE's eight tasks in its training order (`scripts/train_seq_naive.sh`)."""

INSTRUCTIONS = {
    "FOMC": "What is the monetary policy stance for the following text? A. dovish, B. hawkish, "
    "C. neutral. Choose one from A, B and C.\n",
    "C-STANCE": "判断以下文本对指定对象的态度，选择一项：A.支持，B.反对，C.中立。输出A，B或者C。\n",
    "ScienceQA": "Choose an answer for the following question and give your reasons.\n\n",
    "NumGLUE-cm": "Solve the following math problem.\n",
    "NumGLUE-ds": "Solve the following math problem.\n",
    "MeetingBank": "Write a summary of the following meeting transcripts.\n",
    "Py150": "Continue writing the code.\n",
    "20Minuten": "Provide a simplified version of the following paragraph in German.\n\n",
}
"""Each task's instruction, the start of its prompts (TRACE's `TASK_PROMT`)."""

SPLIT_FILES = {"train": "train.json", "eval": "test.json"}
"""Our split -> TRACE's file: training on `train.json`, scoring on `test.json` as TRACE does
(`inference/infer_single.py` evaluates the test split; `eval.json` is its validation set)."""


def source_file(root: str | os.PathLike, task: str, split: str) -> Path:
    """`<root>/<task>/<file>` of our `split` (`train` or `eval`)."""
    if split not in SPLIT_FILES:
        raise ValueError(f"unknown split {split!r} (expected one of {', '.join(SPLIT_FILES)})")
    return Path(root) / task / SPLIT_FILES[split]


def read_samples(path: str | os.PathLike) -> list[dict[str, str]]:
    """The `{"prompt", "answer"}` records of one TRACE file, or a UserError, one line per problem
    (`FILE:INDEX: FIELD: reason`, INDEX the 0-based position in the JSON array)."""
    try:
        records = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read: {error}") from None
    except json.JSONDecodeError as error:
        raise UserError(f"{path}:{error.lineno}: not JSON: {error.msg}") from None
    if not isinstance(records, list):
        raise UserError(f"{path}: expected a JSON array of {{prompt, answer}} objects")
    problems = []
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            problems.append(f"{path}:{index}: expected an object with prompt and answer")
            continue
        for field in ("prompt", "answer"):
            value = record.get(field)
            if not isinstance(value, str):
                problems.append(f"{path}:{index}: {field}: must be a string")
            elif not value and field == "answer":
                problems.append(f"{path}:{index}: answer: empty (nothing to train on or score)")
    if problems:
        raise UserError(*problems)
    if not records:
        raise UserError(f"{path}: no samples")
    return [{"prompt": r["prompt"], "answer": r["answer"]} for r in records]


def to_chat(sample: dict[str, str]) -> dict:
    """One TRACE sample as a chat line: the prompt as the user turn, the answer as the reply."""
    return {
        "messages": [
            {"role": "user", "content": sample["prompt"]},
            {"role": "assistant", "content": sample["answer"]},
        ]
    }


def write_chat(source: str | os.PathLike, out: str | os.PathLike) -> int:
    """Convert one TRACE file into chat JSONL at `out` (atomically); the number of samples.

    Line N of `out` is sample N of `source`, so a score can be matched back to its sample.
    """
    samples = read_samples(source)
    with atomic_path(Path(out)) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for sample in samples:
            handle.write(json.dumps(to_chat(sample), ensure_ascii=False) + "\n")
    return len(samples)
