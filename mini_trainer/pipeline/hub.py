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

from mini_trainer.pipeline.layout import Config, base_model

MODEL_RECORD = "results/model/base.json"
"""The resolve_model rule's output: snapshot folder, Hub id, revision and commit."""


def hub_model(config: Config) -> tuple[str, str] | None:
    """(ORG/NAME, commit) when `model:` is a Hub id (neither demo nor a local folder), else None;
    `ConfigError("config: model", ...)` when it cannot be resolved."""
    model = config["model"]
    if model == "demo" or os.path.isdir(model):
        return None
    return model, _commit(model, config.get("model_revision") or "main")


@functools.cache
def _commit(model: str, revision: str) -> str:
    from mini_trainer.errors import UserError
    from mini_trainer.models.hub import lookup_commit
    from mini_trainer.pipeline.checks import ConfigError

    try:
        return lookup_commit(model, revision)
    except UserError as error:
        raise ConfigError("config: model", " ".join(error.lines)) from None


def model_revision(config: Config, path: str) -> str | None:
    """The commit a job reading model `path` is pinned to (the base model when a Hub id)."""
    hub = hub_model(config)
    return hub[1] if hub and path == base_model(config) else None


def model_input(config: Config, path: str) -> str:
    """What a job reading model `path` depends on: the Hub model's record, else the folder."""
    return MODEL_RECORD if model_revision(config, path) else path


def model_flags(config: Config, path: str) -> str:
    """`--model PATH`, plus `--model-revision COMMIT` for the Hub model."""
    revision = model_revision(config, path)
    pinned = f" --model-revision {revision}" if revision else ""
    return f"--model {shlex.quote(path)}{pinned}"
