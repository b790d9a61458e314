"""The `trace:` config key (config/trace.yaml): which TRACE file the `trace_chat` rule turns into
each task's chat JSONL, the checksum it must have, and where each checkpoint's generated answers
(`trace_generate`) and TRACE scores (`trace_score`) go.

TRACE's data is one archive linked from its repository's README (not on the Hugging Face Hub;
see `mini_trainer.data.trace`), unpacked under `trace.root` in TRACE's own layout. The
`trace_chat` rule writes `results/data/trace/<task>.<split>.jsonl` from
`<root>/<task>/{train,test}.json`; the config's `tasks:` name those files with `format: chat`, so
the `tokenize` rule renders them with the model's chat template like any chat task.
"""

from __future__ import annotations

import shlex

from mini_trainer.data.trace import SPLIT_FILES, TASKS, source_file
from mini_trainer.pipeline.errors import Config, ConfigError
from mini_trainer.pipeline.layout import eval_sources, evaluated_source, parse_source

CHAT_DIR = "results/data/trace"
"""Where the trace_chat rule writes each task's chat JSONL."""


def trace_chat_file(task: str, split: str) -> str:
    """The chat JSONL the trace_chat rule writes for (task, split)."""
    return f"{CHAT_DIR}/{task}.{split}.jsonl"


def trace_source(config: Config, task: str, split: str) -> str:
    """The TRACE file of (task, split) under `trace.root`; a ConfigError for a task TRACE lacks."""
    if task not in TASKS:
        raise ConfigError("config: trace", f"{task!r} is not a TRACE task (tasks: "
                          f"{', '.join(TASKS)})")  # fmt: skip
    return str(source_file(config["trace"]["root"], task, split))


def trace_chat_flags(config: Config, task: str, split: str) -> str:
    """`--sha256 HEX` when `trace.sha256` pins the file (`<task>/<file>` -> hex), else ""."""
    name = f"{task}/{SPLIT_FILES[split]}"
    digest = config["trace"].get("sha256", {}).get(name)
    return f" --sha256 {shlex.quote(digest)}" if digest else ""


def check_trace_config(config: Config) -> None:
    """Every stage a TRACE task whose files the trace_chat rule writes, and the checksums named
    by TRACE file (a ConfigError naming the key otherwise)."""
    if "trace" not in config:
        return
    for task in config["stages"]:
        trace_source(config, task, "train")
        spec = config.get("tasks", {}).get(task, {})
        expected = {"train": trace_chat_file(task, "train"), "eval": trace_chat_file(task, "eval"),
                    "format": "chat"}  # fmt: skip
        for key, value in expected.items():
            if spec.get(key) != value:
                raise ConfigError(f"config: tasks.{task}.{key}", f"{value!r} expected with "
                                  f"`trace:` (the trace_chat rule's output), not "
                                  f"{spec.get(key)!r}")  # fmt: skip
    known = {f"{task}/{file}" for task in TASKS for file in SPLIT_FILES.values()}
    for name in config["trace"].get("sha256", {}):
        if name not in known:
            raise ConfigError(f"config: trace.sha256.{name}", "not a TRACE file "
                              "(expected <task>/train.json or <task>/test.json)")  # fmt: skip


def trace_predictions(source: str, task: str) -> str:
    """The trace_generate rule's answers of checkpoint `source` to `task`'s eval prompts."""
    return f"results/trace/predictions/{source}/{task}.jsonl"


def trace_score_file(source: str, task: str) -> str:
    """The trace_score rule's TRACE score of checkpoint `source` on `task`."""
    return f"results/trace/scores/{source}/{task}.json"


def trace_scores(config: Config) -> list[tuple[str, str]]:
    """(score file, task) of every checkpoint on every stage task, a shared run's once; empty
    without `trace:`."""
    if "trace" not in config:
        return []
    sources = dict.fromkeys(evaluated_source(config, s) for s in eval_sources(config))
    return [(trace_score_file(s, task), task) for s in sources for task in config["stages"]]


def trace_score_flags(config: Config) -> list[list[str]]:
    """`--score PATH METHOD LR STAGE TASK` fields of every cell (`-` `-` `0` the base model);
    a run two methods share gives both cells the one file, as its evaluations do."""
    if "trace" not in config:
        return []
    fields = []
    for source in eval_sources(config):
        parsed = parse_source(source)
        method, lr, stage = parsed if parsed else ("-", "-", 0)
        for task in config["stages"]:
            path = trace_score_file(evaluated_source(config, source), task)
            fields.append([path, method, lr, str(stage), task])
    return fields
