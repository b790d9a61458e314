"""Where the pipeline's files are and how a training job is resolved: pure functions of the
(schema-validated) config, so every path and run key can be unit-tested without Snakemake.

    resources/demo/{model,data}                      demo_assets (model: demo only)
    results/data/tokenized/{task}.{split}.jsonl      tokenize (tasks with format: chat)
    results/data/mix/{name}.{jsonl,mix.json}         mix (stage mixtures, replay)
    results/data/{task}.split.{train,validation}.jsonl   split_validation (data.validation_fraction)
    results/data/{task | mix/name}.train.{index.parquet,summary.json}  validate
    results/osft_svd/{source}/{targets}/             osft_svd of a stage's starting weights
    results/ewc_fisher/{method}/lr{lr}/stage{i}/{key}/   ewc_fisher of a stage's final weights
    results/train/{method}/lr{lr}/stage{i}/{key}/    a training run folder (resumable)
        final/                                       ... its only declared output
        state/step_K/                                ... while it trains (dropped once final/
                                                         is written, unless keep_states_after_final)
        best/                                        ... with a validation file (--save-best)
    results/interpolate/{method}/lr{lr}/stage{i}/{key}/wise{pct}/   interpolate (WiSE-FT)
    results/eval/{base | method/lr{lr}/stage{i}}/{task}.json                  evaluate
    results/manifest.json, results/report/report.html                 manifest, report

`lr` is a learning rate as it appears in paths (`lr_str`), `stage` is 1-based.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from mini_trainer.pipeline import data
from mini_trainer.pipeline.errors import Config, PipelineError
from mini_trainer.pipeline.hub import model_revision
from mini_trainer.pipeline.interpolation import interpolated_series

DEMO_DIR = "resources/demo"
# The tasks `mini-trainer demo-assets` builds (mini_trainer/demo/tasks.py; a test keeps them equal;
# not imported from there, so that reading the Snakefile stays free of the demo's imports).
DEMO_TASKS = ["sort", "sort_desc", "sort_plus1"]
BASE = "base"
RUN_KEY_LENGTH = 10


# ---------------------------------------------------------------------------------------------
# Names.


def lr_str(lr: float) -> str:
    """A learning rate as it appears in paths: Python's shortest round-trip form (0.003, 1e-05)."""
    return repr(float(lr))


def lr_value(config: Config, method: str, lr: str) -> float:
    """The configured learning rate of `method` whose path form is `lr`."""
    if method not in config["methods"]:
        raise PipelineError(f"unknown method {method!r} (config: methods)")
    for value in config["methods"][method]["learning_rates"]:
        if lr_str(value) == lr:
            return float(value)
    raise PipelineError(f"learning rate {lr} is not in config: methods.{method}.learning_rates")


def first_stage(config: Config, method: str) -> int:
    """The first stage `method` trains: 1, or the last for the multi-task bound
    (`multitask: true`: one run, from the base model, on every stage's data)."""
    return len(config["stages"]) if data.is_multitask(config, method) else 1


def sweep(config: Config) -> list[tuple[str, str, int]]:
    """Every (method, lr as in paths, stage number) the config trains, stages 1-based."""
    return [
        (method, lr_str(lr), stage)
        for method, spec in config["methods"].items()
        for lr in spec["learning_rates"]
        for stage in range(first_stage(config, method), len(config["stages"]) + 1)
    ]


def short_hash(value: Any) -> str:
    """First RUN_KEY_LENGTH hex digits of the sha256 of `value`'s canonical JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:RUN_KEY_LENGTH]


# ---------------------------------------------------------------------------------------------
# Data.


def base_model(config: Config) -> str:
    return f"{DEMO_DIR}/model" if config["model"] == "demo" else config["model"]


def task_file(config: Config, task: str, split: str) -> str:
    """The pre-tokenized JSONL of `task`'s `split` (train or eval): a chat task's is the
    `tokenize` rule's output."""
    if task in config["tasks"]:
        if data.task_format(config, task) == "chat":
            return f"results/data/tokenized/{task}.{split}.jsonl"
        return config["tasks"][task][split]
    return f"{DEMO_DIR}/data/{task}.{split}.jsonl"


def validation_file(config: Config, task: str) -> str | None:
    """The file `task` validates on during training: its own, or the split; None without."""
    own = config["tasks"].get(task, {}).get("validation")
    if own:
        return own
    if config["data"].get("validation_fraction"):
        return f"results/data/{task}.split.validation.jsonl"
    return None


def chat_file(config: Config, task: str, split: str) -> str:
    """The chat JSONL a `format: chat` task gives for `split`."""
    return config["tasks"][task][split]


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "tokenizer.model",
)


def tokenizer_files(config: Config) -> list[str]:
    """The base model's tokenizer files, so editing one in place reruns tokenization. (Not for
    the demo: its model folder is a rule's output, whose files Snakemake cannot list.) Reads the
    file system, unlike the rest of this module."""
    model = base_model(config)
    if config["model"] == "demo" or not os.path.isdir(model):
        return []
    return [f"{model}/{name}" for name in TOKENIZER_FILES if os.path.isfile(f"{model}/{name}")]


def stage_dataset(config: Config, method: str, stage: int) -> str:
    """What (method, stage) trains on: the stage's task, or a mixture (`mix/...`)."""
    return data.mix_name(config, method, stage) or config["stages"][stage - 1]


def train_file(config: Config, dataset: str) -> str:
    """The training JSONL of a dataset: a task's file or a `mix` rule's output."""
    if dataset.startswith(data.MIX_PREFIX):
        return f"results/data/{dataset}.jsonl"
    if validation_file(config, dataset) == f"results/data/{dataset}.split.validation.jsonl":
        return f"results/data/{dataset}.split.train.jsonl"  # less the validation split
    return task_file(config, dataset, "train")


def mix_inputs(config: Config, name: str) -> list[tuple[str, str, str]]:
    """(training file, kind, value) of each input of the mixture `mix/{name}`."""
    try:
        inputs = data.mix_inputs_of_name(config, f"{data.MIX_PREFIX}{name}")
    except ValueError as error:
        raise PipelineError(str(error)) from None
    return [(train_file(config, task), kind, repr(value)) for task, kind, value in inputs]


def data_index(task: str) -> str:
    return f"results/data/{task}.train.index.parquet"


def data_summary(task: str) -> str:
    return f"results/data/{task}.train.summary.json"


# ---------------------------------------------------------------------------------------------
# Training runs.


def method_options(config: Config, method: str) -> dict[str, Any]:
    """The method's training options: `training` overridden by `methods.<method>.training`,
    and the entry's `method:` (a registered method's name) as `method`."""
    entry = config["methods"][method]
    options = {**config["training"], **entry.get("training", {})}
    if "method" in entry:
        options["method"] = entry["method"]
    return options


def selected_method(options: dict[str, Any]) -> str:
    """The registered method training options select (`osft: true` is `method: osft`)."""
    return options.get("method") or ("osft" if options.get("osft") else "sft")


def uses_method(options: dict[str, Any], name: str) -> bool:
    """Whether training options select method `name`."""
    return selected_method(options) == name


def svd_targets_key(options: dict[str, Any]) -> str:
    """Folder name of an SVD for the method's target patterns: shared by equal patterns."""
    patterns = options.get("osft_target_patterns")
    if not patterns:
        return "default-targets"
    return f"targets-{short_hash(patterns)}"


def svd_dir(config: Config, method: str, lr: str, stage: int) -> str:
    """The SVD cache of (method, lr, stage)'s starting weights.

    Named after those weights, not after the job that uses them, so every job that starts
    from the same weights with the same target patterns shares one: stage 1 of every OSFT
    method and learning rate shares the base model's.
    """
    return _svd_dir(config, method, _previous_run(config, method, lr, stage))


def _svd_dir(config: Config, method: str, previous_run: str | None) -> str:
    source = BASE if previous_run is None else previous_run.removeprefix("results/train/")
    return f"results/osft_svd/{source}/{svd_targets_key(method_options(config, method))}"


def svd_model(config: Config, source: str) -> str:
    """The weights an SVD folder's `source` names (inverse of `svd_dir`)."""
    return base_model(config) if source == BASE else f"results/train/{source}/final"


def svd_target_patterns(config: Config, targets: str) -> list[str]:
    """The target patterns whose folder name is `targets` (see `svd_targets_key`)."""
    for method in config["methods"]:
        options = method_options(config, method)
        if uses_method(options, "osft") and svd_targets_key(options) == targets:
            return options.get("osft_target_patterns") or []
    raise PipelineError(f"no OSFT method in the config uses targets {targets!r}")


EWC_FISHER_DEFAULTS = {"gamma": 1.0, "batch_size": 8, "max_samples": None}
"""`ewc-fisher`'s settings when a method's `ewc_fisher:` entry leaves them out."""


def ewc_fisher_dir(run: str) -> str:
    """The Fisher folder of a run's final weights (`results/train/...` -> `results/ewc_fisher/...`):
    taken once, read by the next stage's job of every EWC method that starts from them."""
    return "results/ewc_fisher/" + run.removeprefix("results/train/")


def ewc_fisher_inputs(config: Config, source: str) -> dict[str, str]:
    """Inputs of the Fisher of the run `source` (`{method}/lr{lr}/stage{i}/{key}`): its final
    weights, its stage's training data, and for stage >= 2 the Fisher of the stage before
    (online EWC accumulates)."""
    method, lr, stage = parse_source(source.rsplit("/", 1)[0])
    run = f"results/train/{source}"
    if run_dir(config, method, lr, stage) != run:
        raise PipelineError(f"{run}: not the run folder of {method} lr{lr} stage {stage} now")
    inputs = {
        "model": f"{run}/final",
        "data": train_file(config, stage_dataset(config, method, stage)),
    }
    previous = _previous_run(config, method, lr, stage)
    if previous is not None:
        inputs["previous"] = ewc_fisher_dir(previous)
    return inputs


def ewc_fisher_settings(config: Config, source: str) -> dict[str, Any]:
    """gamma, batch_size, max_samples of the Fisher of `source` (its method's `ewc_fisher:`)."""
    method = source.split("/", 1)[0]
    return {**EWC_FISHER_DEFAULTS, **config["methods"][method].get("ewc_fisher", {})}


def start_model(config: Config, method: str, lr: str, stage: int) -> str:
    """Stage 1 starts from the base model, stage i from stage i-1's final/ of the same run."""
    previous = _previous_run(config, method, lr, stage)
    return base_model(config) if previous is None else f"{previous}/final"


def training_options(config: Config, method: str, lr: str, stage: int) -> dict[str, Any]:
    """Every flag of (method, lr, stage)'s training job, except the output folder (and
    `--drop-states-after-final`: `commands.drop_states_flag`)."""
    return _stage_options(config, method, lr, stage, _previous_run(config, method, lr, stage))


def _stage_options(
    config: Config, method: str, lr: str, stage: int, previous_run: str | None
) -> dict[str, Any]:
    task = config["stages"][stage - 1]
    dataset = stage_dataset(config, method, stage)
    options = method_options(config, method)
    options.update(
        model_name_or_path=base_model(config) if previous_run is None else f"{previous_run}/final",
        data_path=train_file(config, dataset),
        data_index=data_index(dataset),
        learning_rate=lr_value(config, method, lr),
        save_final_checkpoint=True,
    )
    revision = model_revision(config, options["model_name_or_path"])
    if previous_run is None and revision:
        options["model_revision"] = revision  # a Hub model, pinned (and in the run key)
    validation = validation_file(config, task)
    if validation:  # best/ is always kept, so evaluation.checkpoint retrains nothing
        options.update(validation_data_path=validation, save_best=True)
    if uses_method(options, "ewc") and previous_run is not None:
        options["ewc_fisher"] = ewc_fisher_dir(previous_run)
    if uses_method(options, "osft"):
        options["osft_svd_cache"] = _svd_dir(config, method, previous_run)
    if options.get("wandb_project"):
        options["wandb_run_name"] = f"{method}-lr{lr}-stage{stage}-{task}"
    return options


def _run_dirs(config: Config, method: str, lr: str, stage: int) -> list[str]:
    """The run folders of stages 1..`stage` of (method, lr) (see `_sweep_run_dirs`)."""
    lr_value(config, method, lr)  # an unknown method or rate is a PipelineError naming it
    return _sweep_run_dirs(config, lr)[method][:stage]


def _sweep_run_dirs(config: Config, lr: str) -> dict[str, list[str]]:
    """The run folders of every stage of every method at learning rate `lr`.

    Built stage by stage, once each: a key names the folder of the stage before (through the
    starting model and SVD cache), so a recursive definition would redo every earlier stage twice
    per stage. A run whose key equals that of an earlier method's run of the same stage (same
    options from the same starting model: replay's stage 1 is SFT's) is that run: one folder,
    trained once, under the first method (config order) that has it.
    """
    launch = config["launch"]
    methods = [
        m for m, spec in config["methods"].items() if lr in map(lr_str, spec["learning_rates"])
    ]
    if not methods:
        raise PipelineError(f"no method of the config has learning rate {lr}")
    dirs: dict[str, list[str]] = {m: [] for m in methods}
    for s in range(1, len(config["stages"]) + 1):
        by_key: dict[str, str] = {}
        for m in methods:
            if s < first_stage(config, m):  # the multi-task bound has no run before the last
                dirs[m].append(None)
                continue
            previous = dirs[m][-1] if dirs[m] else None
            options = _stage_options(config, m, lr, s, previous)
            key = short_hash(
                {
                    "options": options,
                    "nproc_per_node": launch["nproc_per_node"],
                    "nodes": launch["nodes"],
                }
            )
            dirs[m].append(by_key.setdefault(key, f"results/train/{m}/lr{lr}/stage{s}/{key}"))
    return dirs


def _previous_run(config: Config, method: str, lr: str, stage: int) -> str | None:
    return _run_dirs(config, method, lr, stage - 1)[-1] if stage > 1 else None


def run_key(config: Config, method: str, lr: str, stage: int) -> str:
    """Short hash of everything that defines the run: its options (which name the starting
    checkpoint, so they chain through the stages) and the launch geometry.

    The run folder is named by it, so a changed option gives a new, empty folder (a fresh run)
    while a rerun with the same options finds its own state and resumes.
    """
    return run_dir(config, method, lr, stage).rsplit("/", 1)[1]


def run_dir(config: Config, method: str, lr: str, stage: int) -> str:
    return _run_dirs(config, method, lr, stage)[-1]


def final_dir(config: Config, method: str, lr: str, stage: int) -> str:
    return f"{run_dir(config, method, lr, stage)}/final"


# ---------------------------------------------------------------------------------------------
# Evaluation sources: "base" or "{method}/lr{lr}/stage{i}".


def eval_sources(config: Config) -> list[str]:
    """The base model, every run, then every interpolated checkpoint (`interpolation.py`)."""
    sources = [BASE] + [f"{m}/lr{lr}/stage{s}" for m, lr, s in sweep(config)]
    for series, (method, _) in interpolated_series(config).items():
        sources += [f"{series}/lr{lr}/stage{s}" for m, lr, s in sweep(config) if m == method]
    return sources


def interpolation_dir(config: Config, series: str, lr: str, stage: int) -> str:
    """The interpolated checkpoint of series `series` (`<method>-wise<pct>`) at (lr, stage)."""
    method, pct = interpolated_series(config)[series]
    run = run_dir(config, method, lr, stage).removeprefix("results/train/")
    return f"results/interpolate/{run}/wise{pct}"


def interpolation_inputs(config: Config, source: str, pct: str) -> dict[str, str]:
    """`previous` (the run's start) and `new` (its final/) of `results/interpolate/{source}`
    (`{method}/lr{lr}/stage{i}/{key}`, the run folder's path) at `pct` percent."""
    method, lr, stage = parse_source(source.rsplit("/", 1)[0])
    run = f"results/train/{source}"
    if run_dir(config, method, lr, stage) != run:
        raise PipelineError(f"{run}: not the run folder of {method} lr{lr} stage {stage} now")
    previous = start_model(config, method, lr, stage)
    if stage == 1 and model_revision(config, previous):
        raise PipelineError(
            f"config: methods.{method}.interpolation_alphas: stage 1 needs a local base model "
            f"folder ({previous} is a Hub id)"
        )
    return {"previous": previous, "new": f"{run}/final"}


def parse_source(source: str) -> tuple[str, str, int] | None:
    """(method, lr, stage) of an evaluation source; None for the base model."""
    if source == BASE:
        return None
    parts = source.split("/")
    if (
        len(parts) == 3
        and parts[1].startswith("lr")
        and parts[2].startswith("stage")
        and parts[2][5:].isdigit()
    ):
        return parts[0], parts[1][2:], int(parts[2][5:])
    raise PipelineError(f"not an evaluation source: {source!r}")


def eval_model(config: Config, source: str) -> str:
    parsed = parse_source(source)
    if parsed is None:
        return base_model(config)
    if parsed[0] in interpolated_series(config):
        return interpolation_dir(config, *parsed)
    return final_dir(config, *parsed)


def eval_checkpoint(config: Config, source: str) -> str:
    """The folder `evaluate` scores: eval_model's, or its run's best/ (evaluation.checkpoint).

    best/ is not a declared output (not every run has one); the evaluate rule depends on
    final/, written after best/."""
    parsed = parse_source(source)
    interpolated = parsed is not None and parsed[0] in interpolated_series(config)
    if parsed is None or interpolated or config["evaluation"]["checkpoint"] == "final":
        return eval_model(config, source)
    return f"{run_dir(config, *parsed)}/best"


def eval_json(source: str, task: str) -> str:
    return f"results/eval/{source}/{task}.json"


def eval_data_files(config: Config) -> list[str]:
    """The eval file of every stage's task, in stage order: what each source is scored on."""
    return [task_file(config, task, "eval") for task in config["stages"]]


def eval_outputs(config: Config, source: str = "{source}") -> list[str]:
    """One evaluate job's JSONs, in the order of `eval_data_files` (a `{source}` pattern by
    default, for the rule's output)."""
    return [eval_json(source, task) for task in config["stages"]]


def evaluated_source(config: Config, source: str) -> str:
    """The source whose evaluation stands for `source`'s: itself, or for a run shared with an
    earlier method (same run key, see `_sweep_run_dirs`) that method's, evaluated once."""
    parsed = parse_source(source)
    if parsed is None or parsed[0] in interpolated_series(config):
        return source
    return run_dir(config, *parsed).removeprefix("results/train/").rsplit("/", 1)[0]


def all_eval_jsons(config: Config) -> list[str]:
    """Every evaluation JSON: each source on each stage's task (a shared run's once)."""
    sources = dict.fromkeys(evaluated_source(config, s) for s in eval_sources(config))
    return [eval_json(s, task) for s in sources for task in config["stages"]]
