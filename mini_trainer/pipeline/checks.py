"""Config checks the schema cannot make, run before any job: names that must refer to each other,
and each method's options checked by the engine's own `TrainingArgs`, so the pipeline refuses
exactly what a training job would refuse, but at once and naming the method and key.

Also a YAML reader whose syntax errors name the file and line (Snakemake's own says neither).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from mini_trainer.errors import UserError
from mini_trainer.models.hub import check_revision
from mini_trainer.pipeline.data import DataConfigError, check_data_config
from mini_trainer.pipeline.errors import ConfigError
from mini_trainer.pipeline.interpolation import interpolation_problems
from mini_trainer.pipeline.layout import (
    DEMO_TASKS,
    Config,
    first_stage,
    lr_str,
    run_dir,
    training_options,
    validation_file,
)
from mini_trainer.pipeline.trace import check_trace_config
from mini_trainer.training_args import TrainingArgs


def read_config_file(path: str | Path) -> Any:
    """The YAML (or JSON) in `path`; a syntax error is `ConfigError("FILE:LINE", problem)`."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = error.problem or error.context or "not valid YAML"
        column = f" (column {mark.column + 1})" if mark else ""
        raise ConfigError(where, f"YAML syntax error: {problem}{column}") from None
    except yaml.YAMLError as error:
        raise ConfigError(str(path), f"YAML error: {error}") from None


def check_yaml_syntax(path: str | Path) -> None:
    """Read `path` if it exists, for its FILE:LINE syntax error (see `read_config_file`)."""
    if Path(path).is_file():
        read_config_file(path)


@contextlib.contextmanager
def exit_on_config_error() -> Iterator[None]:
    """A `ConfigError` in the block ends the process: its one line on stderr, exit status 2.

    Raised through Snakemake, it would print as a `WorkflowError` naming the Snakefile's line
    instead, on two lines.
    """
    try:
        yield
    except ConfigError as error:
        print(error, file=sys.stderr)
        raise SystemExit(2) from None


def key_source(
    key: str,
    command_line: Mapping[str, Any],
    configfiles: Sequence[str | Path],
    cli_configfiles: Sequence[str | Path],
) -> str:
    """Where the value of top-level `key` comes from: `config` for `--config KEY=...` (it wins),
    else the config file of highest precedence that sets it (the last `--configfile` first,
    the Snakefile's `configfile` last), else `config`."""
    if key in command_line:
        return "config"
    cli = [str(path) for path in cli_configfiles]
    own = [str(path) for path in configfiles if str(path) not in cli]
    for path in reversed(own + cli):
        with contextlib.suppress(OSError, yaml.YAMLError):
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
            if isinstance(data, dict) and key in data:
                return path
    return "config"


def check_before_schema(
    config: Config,
    command_line: Mapping[str, Any],
    configfiles: Sequence[str | Path],
    cli_configfiles: Sequence[str | Path],
) -> None:
    """Values refused before the schema check, in one line naming the file and key, exit 2: an
    empty `model_revision` (YAML's `model_revision:` is None, which the schema refuses in
    Snakemake's several lines, and a blank string it would take), refused by the rule
    `--model-revision` follows (`check_revision`), never taken as `main`."""
    if "model_revision" not in config:
        return
    revision = config["model_revision"]
    if revision is not None:
        if not isinstance(revision, str):
            return  # the schema's type error
        try:
            check_revision(revision)
            return
        except UserError:
            pass
    shown = "" if revision is None else f" ({revision!r})"
    raise ConfigError(
        f"{key_source('model_revision', command_line, configfiles, cli_configfiles)}: "
        "model_revision",
        f"empty{shown}; name a branch, tag or commit, or leave the key out for main",
    )


def data_token_cap(config: Config) -> int:
    """The token cap the pipeline's `validate` checks the data against: one packed row's budget,
    `training.max_tokens_per_gpu` times `training.context_parallel` (a group's row with context
    parallelism, docs/context_parallel.md)."""
    training = config["training"]
    return training["max_tokens_per_gpu"] * training.get("context_parallel", 1)


def check_config(config: Config) -> None:
    """Raise `ConfigError` for the first cross-key problem of a schema-validated config."""
    _check_stages(config)
    try:
        check_data_config(config, DEMO_TASKS)
    except DataConfigError as error:
        raise ConfigError(f"config: {error.key}", error.reason) from None
    check_trace_config(config)
    _check_gpus(config)
    if config["training"].get("max_tokens_per_gpu") is None:
        raise ConfigError(
            "config: training.max_tokens_per_gpu", "required (the data is validated against it)"
        )
    shared_cap = data_token_cap(config)
    what = "training.max_tokens_per_gpu"
    if config["training"].get("context_parallel", 1) > 1:
        what += " x training.context_parallel"
    for name, method in config["methods"].items():
        options = method.get("training", {})
        cap = data_token_cap({"training": {**config["training"], **options}})
        if cap < shared_cap:
            raise ConfigError(
                f"config: methods.{name}.training.max_tokens_per_gpu",
                f"{cap} is below {what} ({shared_cap}), the cap the data "
                "is validated against; lower the shared value instead",
            )
        reprs = [lr_str(lr) for lr in method["learning_rates"]]
        if len(set(reprs)) != len(reprs):
            raise ConfigError(f"config: methods.{name}.learning_rates", "has the same rate twice")
        _check_validation(config, name)
        for lr in reprs:
            check_method_options(config, name, lr)
    _check_validation(config, None)
    for key, problem in interpolation_problems(config):
        raise ConfigError(key, problem)


VALIDATION_OPTIONS = (
    "validation_every_steps",
    "validation_max_tokens_per_gpu",
    "best_metric",
    "early_stopping_patience",
    "early_stopping_min_delta",
)
"""Options that only mean something with a validation file (the pipeline passes the file)."""


def _check_validation(config: Config, method: str | None) -> None:
    """Validation options (of `method`) or `evaluation.checkpoint: best` (`method` None) need
    a validation file for every stage: say so, rather than the engine's "needs
    --validation-data-path", which the pipeline sets itself."""
    missing = [t for t in config["stages"] if not validation_file(config, t)]
    if not missing:
        return
    where = (
        f"no validation file for {', '.join(missing)} (set data.validation_fraction, or "
        "tasks.<task>.validation)"
    )
    if method is None:
        if config["evaluation"]["checkpoint"] == "best":
            raise ConfigError("config: evaluation.checkpoint", f"best: {where}")
        return
    own = config["methods"][method].get("training", {})
    for key in VALIDATION_OPTIONS:
        if key in own:
            raise ConfigError(f"config: methods.{method}.training.{key}", where)
        if key in config["training"]:
            raise ConfigError(f"config: training.{key} (method {method})", where)


def _check_gpus(config: Config) -> None:
    """GPU jobs are planned first (planning.py): the plan needs the memory of one GPU."""
    launch = config["launch"]
    if not launch["gpus_per_node"]:
        return
    if launch.get("gpu_memory_gib") is None:
        raise ConfigError(
            "config: launch.gpu_memory_gib",
            f"required with gpus_per_node {launch['gpus_per_node']} (memory of one GPU, GiB: "
            "the plan rule checks that every method fits before training)",
        )
    if launch.get("gpu"):
        # deferred: torch (training/flops.py); the config check loads it only for launch.gpu
        from mini_trainer.training.flops import peak_flops

        if peak_flops(launch["gpu"]) is None:
            raise ConfigError(
                "config: launch.gpu",
                f"unknown GPU name {launch['gpu']!r} (one that `mini-trainer plan --gpu` "
                "knows: H100, H200, A100, B200, L40S, ...)",
            )


def _check_stages(config: Config) -> None:
    is_demo = config["model"] == "demo"
    for i, task in enumerate(config["stages"]):
        if task not in config["tasks"] and not (is_demo and task in DEMO_TASKS):
            known = sorted(config["tasks"]) + (DEMO_TASKS if is_demo else [])
            raise ConfigError(
                f"config: stages[{i}]",
                f"unknown task {task!r} (known: {', '.join(known) or 'none'}; "
                "add it under `tasks:`)",
            )


def method_training_args(config: Config, method: str, lr: str) -> TrainingArgs:
    """The `TrainingArgs` of (method, lr)'s first stage, as its job will build them."""
    stage = first_stage(config, method)
    options = training_options(config, method, lr, stage)
    return TrainingArgs(**options, output_dir=run_dir(config, method, lr, stage))


def check_method_options(config: Config, method: str, lr: str) -> None:
    """Build (method, lr)'s `TrainingArgs`: the engine's refusal becomes a `ConfigError` naming
    the key where the method's value comes from (its own `training`, or the shared one)."""
    try:
        method_training_args(config, method, lr)
    except UserError as error:
        first = error.lines[0]
        flag, _, reason = first.partition(": ")
        key = flag.removeprefix("--").replace("-", "_")
        reason = re.sub(r"--([a-z][a-z0-9-]*)", lambda m: m.group(1).replace("-", "_"), reason)
        if key == "learning_rate":
            where = f"config: methods.{method}.learning_rates"
        elif key in config["training"] and key not in config["methods"][method].get("training", {}):
            where = f"config: training.{key} (method {method})"
        else:
            where = f"config: methods.{method}.training.{key}"
        raise ConfigError(where, reason) from None


def main(argv: list[str] | None = None) -> int:
    """`python -m mini_trainer.pipeline FILE...`: each file's YAML syntax, FILE:LINE."""
    status = 0
    for path in sys.argv[1:] if argv is None else argv:
        try:
            read_config_file(path)
        except (ConfigError, OSError) as error:
            print(error, file=sys.stderr)
            status = 2
    return status
