"""What each pipeline training job trains on: a task's file, a chat file tokenized in the DAG,
a stage mixture, or a replay mixture, and the config checks these keys need.

Pure functions of the config dict, so the decisions are unit-tested (tests/test_pipeline_data.py);
`layout` turns them into paths and `checks.check_config` reports `DataConfigError` as a
`ConfigError`. Config keys (config/README.md):

- `tasks.<t>.format`: `tokenized` (default) or `chat` (tokenized by the `tokenize` rule).
- `mixtures.<stage task>`: dataset name -> weight; the stage trains on that mixture
  (`mini-trainer mix`: the stage's own task anchors it, every one of its samples once).
- `methods.<m>.replay_fraction`: at stage i >= 2 the method also trains on that fraction of
  each earlier stage task's training samples (drawn without replacement, seeded by `data.seed`).
"""

from __future__ import annotations

import math

FORMATS = ("tokenized", "chat")
DEFAULT_FORMAT = "tokenized"
MIX_PREFIX = "mix/"


class DataConfigError(ValueError):
    """A config problem of the data keys, reported as `config: KEY: reason`."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"config: {key}: {reason}")
        self.key = key
        self.reason = reason


def known_datasets(config: dict, demo_tasks: list[str]) -> list[str]:
    """Every dataset name a stage or a mixture may use."""
    extra = demo_tasks if config["model"] == "demo" else []
    return sorted(set(config.get("tasks", {})) | set(extra))


def task_format(config: dict, task: str) -> str:
    return config.get("tasks", {}).get(task, {}).get("format", DEFAULT_FORMAT)


def is_multitask(config: dict, method: str) -> bool:
    """`multitask: true`: the multi-task bound, one training on every stage's data."""
    return bool(config["methods"][method].get("multitask", False))


def replay_fraction(config: dict, method: str) -> float:
    """The share of each earlier stage's samples that (method, stage) adds; 1.0 (all of them)
    for the multi-task bound, whose one run is the last stage's with everything replayed."""
    if is_multitask(config, method):
        return 1.0
    return float(config["methods"][method].get("replay_fraction", 0.0))


def check_data_config(config: dict, demo_tasks: list[str]) -> None:
    """Raise `DataConfigError` for the first bad data key (the schema checks types only)."""
    known = known_datasets(config, demo_tasks)
    for name, spec in config.get("tasks", {}).items():
        form = spec.get("format", DEFAULT_FORMAT)
        if form not in FORMATS:
            raise DataConfigError(
                f"tasks.{name}.format",
                f"unknown format {form!r} (expected one of {', '.join(FORMATS)})",
            )
    for i, task in enumerate(config["stages"]):
        if task in config.get("tasks", {}) and "eval" not in config["tasks"][task]:
            raise DataConfigError(f"tasks.{task}.eval", f"required: stage {i + 1} trains on it")
    for task, weights in config.get("mixtures", {}).items():
        key = f"mixtures.{task}"
        if task not in config["stages"]:
            raise DataConfigError(key, f"{task!r} is not a stage (stages: "
                                  f"{', '.join(config['stages'])})")  # fmt: skip
        for name, weight in weights.items():
            if name not in known:
                raise DataConfigError(
                    f"{key}.{name}",
                    f"unknown dataset (known: {', '.join(known)}; add it under `tasks:`)",
                )
            if not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
                raise DataConfigError(f"{key}.{name}", f"weight {weight!r} must be a number >= 0")
        if sum(weights.values()) <= 0:
            raise DataConfigError(key, "the weights sum to zero")
        if weights.get(task, 0) <= 0:
            raise DataConfigError(
                f"{key}.{task}",
                "the stage's own task needs a positive weight (its samples anchor the mixture)",
            )
    for method, spec in config["methods"].items():
        fraction = spec.get("replay_fraction")
        if spec.get("multitask") and fraction is not None:
            raise DataConfigError(
                f"methods.{method}.replay_fraction",
                "not with multitask: true (the multi-task bound trains on all of every stage)",
            )
        if fraction is None:
            continue
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, (int, float))
            or not (0.0 <= fraction <= 1.0)
        ):
            raise DataConfigError(
                f"methods.{method}.replay_fraction", f"{fraction!r} is outside [0, 1]"
            )


def mix_inputs(config: dict, method: str, stage: int) -> list[tuple[str, str, float]] | None:
    """(dataset, kind, value) inputs of (method, stage)'s mixture, or None when the stage trains
    on its task's file as it is. kind is "weight" or "replay"; the stage's task comes first."""
    task = config["stages"][stage - 1]
    weights = config.get("mixtures", {}).get(task)
    inputs = [(task, "weight", float(weights[task]) if weights else 1.0)]
    if weights:
        inputs += [(name, "weight", float(w)) for name, w in weights.items() if name != task]
    fraction = replay_fraction(config, method)
    if fraction > 0:
        inputs += [(earlier, "replay", fraction) for earlier in config["stages"][: stage - 1]]
    return inputs if len(inputs) > 1 else None


def mix_name(config: dict, method: str, stage: int) -> str | None:
    """The mixed dataset's name (`mix/<task>` or `mix/<task>-replay<fraction>`), or None.

    Named by what it contains, so methods with the same mixture share one file.
    """
    if mix_inputs(config, method, stage) is None:
        return None
    task = config["stages"][stage - 1]
    fraction = replay_fraction(config, method)
    suffix = f"-replay{float(fraction)!r}" if fraction > 0 and stage > 1 else ""
    return f"{MIX_PREFIX}{task}{suffix}"


def parse_mix_name(config: dict, name: str) -> tuple[int, float]:
    """(stage, replay fraction) of a `mix_name`; ValueError if it is not one."""
    if not name.startswith(MIX_PREFIX):
        raise ValueError(f"not a mixture name: {name!r}")
    task, _, fraction = name[len(MIX_PREFIX) :].partition("-replay")
    if task not in config["stages"]:
        raise ValueError(f"mixture {name!r} names no stage")
    return config["stages"].index(task) + 1, float(fraction) if fraction else 0.0


def mix_inputs_of_name(config: dict, name: str) -> list[tuple[str, str, float]]:
    """The inputs of the mixture `name` (inverse of `mix_name`)."""
    stage, fraction = parse_mix_name(config, name)
    for method in config["methods"]:
        if replay_fraction(config, method) == fraction and mix_name(config, method, stage) == name:
            return mix_inputs(config, method, stage)
    raise ValueError(f"no method of the config trains on {name!r}")
