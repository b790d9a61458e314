"""The `plan` rule: `mini-trainer plan --require-fit` before any GPU training job, so a config
that cannot fit the GPUs of `launch:` fails the DAG in seconds, not after the queue wait and the
model load (issue 23 point 4).

One plan per method: every learning rate and stage of a method trains with the same options on
the same architecture (a stage > 1 starts from the previous stage's final/, whose config.json is
the base model's), so the base model's config.json plans them all, at DAG-build time. CPU
configs (`launch.gpus_per_node: 0`) have no plan job.
"""

from __future__ import annotations

from typing import Any

from mini_trainer.pipeline.checks import VALIDATION_OPTIONS
from mini_trainer.pipeline.layout import Config, method_options

PLAN_DIR = "results/plan"


def plan_needed(config: Config) -> bool:
    """Whether training jobs run on GPUs, and therefore wait for their method's plan."""
    return config["launch"]["gpus_per_node"] > 0


def plan_file(method: str) -> str:
    """The plan rule's output: the table of `mini-trainer plan` for `method`."""
    return f"{PLAN_DIR}/{method}.txt"


def plan_training_options(config: Config, method: str) -> dict[str, Any]:
    """The method's training options that `plan` takes (as `train` does), for every lr and
    stage: the method's own, less validation's (they need the validation file the job is
    given, and a validation pass, without gradients, never sets the training step's peak)."""
    options = method_options(config, method)
    return {k: v for k, v in options.items() if k not in VALIDATION_OPTIONS}
