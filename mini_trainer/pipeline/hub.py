"""`model: ORG/NAME` in the pipeline: the commit it stands for, and what jobs depend on.

The commit that `model_revision` names is looked up once, when the DAG is built, on the
submitting host (one Hub call, or the cache's `refs/` offline; nothing for a commit). Every job
that reads the base model is pinned to it (`--model-revision COMMIT`) and takes the
`resolve_model` rule's record (`MODEL_RECORD`) as input instead of a folder, and the run keys
include it: the same commit reruns nothing, a new one reruns everything downstream.
"""

from __future__ import annotations

import functools
import os
import shlex

from mini_trainer.errors import UserError
from mini_trainer.models.hub import lookup_commit
from mini_trainer.pipeline.errors import Config, ConfigError

MODEL_RECORD = "results/model/base.json"
"""The resolve_model rule's output: snapshot folder, Hub id, revision and commit."""


def hub_model(config: Config) -> tuple[str, str] | None:
    """(ORG/NAME, commit) when `model:` is a Hub id (neither demo nor a local folder), else None;
    `ConfigError("config: model", ...)` when it cannot be resolved (common.smk asks first)."""
    if not _is_hub(config):
        return None
    commit, problem = _lookup(config["model"], _revision(config))
    if problem:
        raise ConfigError("config: model", problem)
    return config["model"], commit


def _is_hub(config: Config) -> bool:
    return config["model"] != "demo" and not os.path.isdir(config["model"])


def _revision(config: Config) -> str:
    return config.get("model_revision") or "main"


@functools.cache
def _lookup(model: str, revision: str) -> tuple[str | None, str | None]:
    """(commit, None), or (None, the one-line problem)."""
    try:
        return lookup_commit(model, revision), None
    except UserError as error:
        return None, " ".join(error.lines)


def model_revision(config: Config, path: str) -> str | None:
    """The revision a job reading model `path` is pinned to: the Hub model's commit (the
    configured revision while it cannot be looked up: `hub_model` reports that), else None."""
    if not _is_hub(config) or path != config["model"]:  # a Hub id is its own base model
        return None
    return _lookup(config["model"], _revision(config))[0] or _revision(config)


def model_input(config: Config, path: str) -> str:
    """What a job reading model `path` depends on: the Hub model's record, else the folder."""
    return MODEL_RECORD if model_revision(config, path) else path


def model_flags(config: Config, path: str) -> str:
    """`--model PATH`, plus `--model-revision COMMIT` for the Hub model."""
    revision = model_revision(config, path)
    pinned = f" --model-revision {revision}" if revision else ""
    return f"--model {shlex.quote(path)}{pinned}"
