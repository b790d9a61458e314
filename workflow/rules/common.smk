# Shared by all rules: where things are, how a training job is resolved from the config,
# and how rules call the package. Rules never spell a path themselves; they ask these functions,
# so the layout below is the one place to read (config/README.md describes it for users).
#
#   resources/demo/{model,data}                      demo_assets (model: demo only)
#   results/data/tokenized/{task}.{split}.jsonl     tokenize (tasks with format: chat)
#   results/data/mix/{name}.{jsonl,mix.json}         mix (stage mixtures, replay)
#   results/data/{task | mix/name}.train.{index.parquet,summary.json}  validate
#   results/osft_svd/{source}/{targets}/             osft_svd of a stage's starting weights
#   results/train/{method}/lr{lr}/stage{i}/{key}/    a training run folder (resumable)
#       final/                                       ... its only declared output
#   results/eval/{base | method/lr{lr}/stage{i}}/{task}.json                  evaluate
#   results/manifest.json, results/report/report.html                 manifest, report
#   logs/..., results/benchmarks/...                 one log and one benchmark per job

import functools
import hashlib
import json
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError

from mini_trainer.data import pipeline_data

try:
    from snakemake_interface_executor_plugins.settings import DeploymentMethod
except ImportError:  # pragma: no cover - older interface package
    DeploymentMethod = None

DEMO_DIR = "resources/demo"
# The tasks `mini-trainer demo-assets` builds (mini_trainer/demo/tasks.py; a test keeps them equal).
DEMO_TASKS = ["sort", "sort_desc", "sort_plus1"]
BASE = "base"
RUN_KEY_LENGTH = 10


def _python():
    """The interpreter that runs Snakemake, so rules work without an activated venv.

    With `--sdm conda` (or a container) the job's environment provides `python` instead.
    """
    methods = getattr(workflow.deployment_settings, "deployment_method", ()) or ()
    if DeploymentMethod is not None and (
        DeploymentMethod.CONDA in methods or DeploymentMethod.APPTAINER in methods
    ):
        return "python"
    return sys.executable


# Rules run `"$MINI_TRAINER_PYTHON" -m mini_trainer <subcommand>`. The interpreter comes from the
# environment rather than from params, so moving the venv does not look like a changed job.
shell.prefix(f"set -euo pipefail; export MINI_TRAINER_PYTHON={shlex.quote(_python())}; ")


class ConfigError(WorkflowError):
    """A config problem the schema cannot see (cross-references between keys)."""

    def __init__(self, key, reason):
        super().__init__(f"config: {key}: {reason}")


# ---------------------------------------------------------------------------------------------
# Config checks beyond the schema: names that must refer to each other.


def _check_config():
    try:
        pipeline_data.check_data_config(config, DEMO_TASKS)
    except pipeline_data.DataConfigError as error:
        raise ConfigError(error.key, error.reason) from None
    is_demo = config["model"] == "demo"
    for i, task in enumerate(config["stages"]):
        if task not in config["tasks"] and not (is_demo and task in DEMO_TASKS):
            known = sorted(config["tasks"]) + (DEMO_TASKS if is_demo else [])
            raise ConfigError(
                f"stages[{i}]", f"unknown task {task!r} (known: {', '.join(known) or 'none'}; "
                "add it under `tasks:`)"
            )
    shared_cap = config["training"].get("max_tokens_per_gpu")
    if shared_cap is None:
        raise ConfigError(
            "training.max_tokens_per_gpu", "required (the data is validated against it)"
        )
    for name, method in config["methods"].items():
        options = method.get("training", {})
        cap = options.get("max_tokens_per_gpu", shared_cap)
        if cap < shared_cap:
            raise ConfigError(
                f"methods.{name}.training.max_tokens_per_gpu",
                f"{cap} is below training.max_tokens_per_gpu ({shared_cap}), the cap the data "
                "is validated against; lower the shared value instead",
            )
        merged = {**config["training"], **options}
        if merged.get("osft") and merged.get("osft_unfreeze_rank_ratio") is None:
            raise ConfigError(
                f"methods.{name}.training.osft_unfreeze_rank_ratio", "required with osft: true"
            )
        if not merged.get("osft"):
            stray = sorted(k for k in options if k.startswith("osft_"))
            if stray:
                raise ConfigError(f"methods.{name}.training.{stray[0]}", "needs osft: true")
        reprs = [lr_str(lr) for lr in method["learning_rates"]]
        if len(set(reprs)) != len(reprs):
            raise ConfigError(f"methods.{name}.learning_rates", "has the same rate twice")


# ---------------------------------------------------------------------------------------------
# Names and paths.


def lr_str(lr):
    """A learning rate as it appears in paths: Python's shortest round-trip form (0.003, 1e-05)."""
    return repr(float(lr))


def lr_value(method, lr):
    """The configured learning rate of `method` whose path form is `lr`."""
    if method not in config["methods"]:
        raise WorkflowError(f"unknown method {method!r} (config: methods)")
    for value in config["methods"][method]["learning_rates"]:
        if lr_str(value) == lr:
            return float(value)
    raise WorkflowError(f"learning rate {lr} is not in config: methods.{method}.learning_rates")


def sweep():
    """Every (method, lr as in paths, stage number) the config trains, stages 1-based."""
    return [
        (method, lr_str(lr), stage)
        for method, spec in config["methods"].items()
        for lr in spec["learning_rates"]
        for stage in range(1, len(config["stages"]) + 1)
    ]


def base_model():
    return f"{DEMO_DIR}/model" if config["model"] == "demo" else config["model"]


def task_file(task, split):
    """The pre-tokenized JSONL of `task`'s `split` (train or eval): a chat task's is the
    `tokenize` rule's output."""
    if task in config["tasks"]:
        if pipeline_data.task_format(config, task) == "chat":
            return f"results/data/tokenized/{task}.{split}.jsonl"
        return config["tasks"][task][split]
    return f"{DEMO_DIR}/data/{task}.{split}.jsonl"


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "tokenizer.model")


def tokenizer_files():
    """The base model's tokenizer files, so editing one in place reruns tokenization. (Not for
    the demo: its model folder is a rule's output, whose files Snakemake cannot list.)"""
    model = base_model()
    if config["model"] == "demo" or not os.path.isdir(model):
        return []
    return [f"{model}/{name}" for name in TOKENIZER_FILES if os.path.isfile(f"{model}/{name}")]


def chat_file(task, split):
    """The chat JSONL a `format: chat` task gives for `split`."""
    return config["tasks"][task][split]


def stage_dataset(method, stage):
    """What (method, stage) trains on: the stage's task, or a mixture (`mix/...`)."""
    return pipeline_data.mix_name(config, method, stage) or config["stages"][stage - 1]


def train_file(dataset):
    """The training JSONL of a dataset: a task's file or a `mix` rule's output."""
    if dataset.startswith(pipeline_data.MIX_PREFIX):
        return f"results/data/{dataset}.jsonl"
    return task_file(dataset, "train")


def mix_sidecar(dataset):
    return f"results/data/{dataset}.mix.json"


def mix_flags(wc):
    """`--input FILE WEIGHT ... --replay FILE FRACTION ...` of the mixture `mix/{wc.name}`."""
    try:
        inputs = pipeline_data.mix_inputs_of_name(config, f"mix/{wc.name}")
    except ValueError as error:
        raise WorkflowError(str(error)) from None
    flags = {"weight": "--input", "replay": "--replay"}
    return " ".join(
        f"{flags[kind]} {shlex.quote(task_file(name, 'train'))} {value!r}"
        for name, kind, value in inputs
    )


def mix_input_files(wc):
    inputs = pipeline_data.mix_inputs_of_name(config, f"mix/{wc.name}")
    return [task_file(name, "train") for name, _, _ in inputs]


def data_index(task):
    return f"results/data/{task}.train.index.parquet"


def data_summary(task):
    return f"results/data/{task}.train.summary.json"


def method_options(method):
    """The method's training options: `training` overridden by `methods.<method>.training`."""
    return {**config["training"], **config["methods"][method].get("training", {})}


def svd_targets_key(options):
    """Folder name of an SVD for the method's target patterns: shared by equal patterns."""
    patterns = options.get("osft_target_patterns")
    if not patterns:
        return "default-targets"
    return f"targets-{_short_hash(patterns)}"


def svd_dir(method, lr, stage):
    """The SVD cache of (method, lr, stage)'s starting weights.

    Named after those weights, not after the job that uses them, so every job that starts
    from the same weights with the same target patterns shares one: stage 1 of every OSFT
    method and learning rate shares the base model's.
    """
    options = method_options(method)
    if stage == 1:
        source = BASE
    else:
        source = f"{method}/lr{lr}/stage{stage - 1}/{run_key(method, lr, stage - 1)}"
    return f"results/osft_svd/{source}/{svd_targets_key(options)}"


def svd_model(source):
    """The weights an SVD folder's `source` names (inverse of `svd_dir`)."""
    return base_model() if source == BASE else f"results/train/{source}/final"


def svd_target_patterns(targets):
    """The target patterns whose folder name is `targets` (see `svd_targets_key`)."""
    for method in config["methods"]:
        options = method_options(method)
        if options.get("osft") and svd_targets_key(options) == targets:
            return options.get("osft_target_patterns") or []
    raise WorkflowError(f"no OSFT method in the config uses targets {targets!r}")


def start_model(method, lr, stage):
    """Stage 1 starts from the base model, stage i from stage i-1's final/ of the same run."""
    if stage == 1:
        return base_model()
    return final_dir(method, lr, stage - 1)


@functools.cache
def training_options(method, lr, stage):
    """Every flag of (method, lr, stage)'s training job, except the output folder."""
    task = config["stages"][stage - 1]
    dataset = stage_dataset(method, stage)
    options = method_options(method)
    options.update(
        model_name_or_path=start_model(method, lr, stage),
        data_path=train_file(dataset),
        data_index=data_index(dataset),
        learning_rate=lr_value(method, lr),
        save_final_checkpoint=True,
    )
    if options.get("osft"):
        options["osft_svd_cache"] = svd_dir(method, lr, stage)
    if options.get("wandb_project"):
        options["wandb_run_name"] = f"{method}-lr{lr}-stage{stage}-{task}"
    return options


@functools.cache
def run_key(method, lr, stage):
    """Short hash of everything that defines the run: its options (which name the starting
    checkpoint, so they chain through the stages) and the launch geometry.

    The run folder is named by it, so a changed option gives a new, empty folder (a fresh run)
    while a rerun with the same options finds its own state and resumes.
    """
    launch = config["launch"]
    return _short_hash(
        {
            "options": training_options(method, lr, stage),
            "nproc_per_node": launch["nproc_per_node"],
            "nodes": launch["nodes"],
        }
    )


def run_dir(method, lr, stage):
    return f"results/train/{method}/lr{lr}/stage{stage}/{run_key(method, lr, stage)}"


def final_dir(method, lr, stage):
    return f"{run_dir(method, lr, stage)}/final"


def _short_hash(value):
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:RUN_KEY_LENGTH]


# ---------------------------------------------------------------------------------------------
# Evaluation sources: "base" or "{method}/lr{lr}/stage{i}".


def eval_sources():
    return [BASE] + [f"{m}/lr{lr}/stage{s}" for m, lr, s in sweep()]


def parse_source(source):
    """(method, lr, stage) of an evaluation source; None for the base model."""
    if source == BASE:
        return None
    try:
        method, lr_part, stage_part = source.split("/")
        assert lr_part.startswith("lr") and stage_part.startswith("stage")
        return method, lr_part[2:], int(stage_part[5:])
    except (ValueError, AssertionError):
        raise WorkflowError(f"not an evaluation source: {source!r}") from None


def eval_model(source):
    parsed = parse_source(source)
    return base_model() if parsed is None else final_dir(*parsed)


def eval_json(source, task):
    return f"results/eval/{source}/{task}.json"


# ---------------------------------------------------------------------------------------------
# Command lines.


def cli_flags(options):
    """`{"batch_size": 8, "osft": True, "p": ["a", "b"]}` -> `--batch-size 8 --osft --p a b`."""
    parts = []
    for name, value in sorted(options.items()):
        flag = f"--{name.replace('_', '-')}"
        if value is None or value is False:
            continue
        if value is True:
            parts.append(flag)
        elif isinstance(value, list):
            parts += [flag, *map(str, value)]
        else:
            parts += [flag, str(value)]
    return " ".join(shlex.quote(p) for p in parts)


def torchrun_launcher():
    """How a training job starts its processes: `mini-trainer launch` (docs/slurm.md).

    Outside Slurm it is one standalone torchrun; in a Slurm job it starts one torchrun per node
    through srun, with the rendezvous on the allocation's first host, so one rule serves 1 or N
    nodes.
    """
    nproc = config["launch"]["nproc_per_node"]
    return f'"$MINI_TRAINER_PYTHON" -m mini_trainer launch --nproc-per-node {nproc} --'


def train_node_resources():
    """Slurm resources of a training job: N nodes, one task (one torchrun) per node.

    srun inside the job needs `mpi="srun"` for several tasks (the plugin refuses it for one);
    GPUs are asked per node with gres, as the plugin's `gpu` would be per job.
    """
    nodes = config["launch"]["nodes"]
    gpus = config["launch"]["gpus_per_node"]
    resources = {"nodes": nodes, "tasks": nodes}
    if nodes > 1:
        resources["mpi"] = "srun"
    if gpus:
        resources.update(gres=f"gpu:{gpus}", tasks_per_gpu=0)
    return resources


def train_threads():
    """CPU slots a training job takes: one per process on CPU, else the configured threads."""
    configured = config["resources"].get("train", {}).get("threads")
    return configured or config["launch"]["nproc_per_node"]


def rule_threads(rule, default=1):
    return config["resources"].get(rule, {}).get("threads", default)


def rule_resource(rule, name):
    return config["resources"][rule][name]


# ---------------------------------------------------------------------------------------------
# Rule inputs and params that need more than a line.


def train_inputs(wc):
    stage = int(wc.stage)
    if wc.key != run_key(wc.method, wc.lr, stage):
        raise WorkflowError(
            f"results/train/{wc.method}/lr{wc.lr}/stage{stage}/{wc.key}: no longer matches the "
            f"config (its run key is now {run_key(wc.method, wc.lr, stage)})"
        )
    dataset = stage_dataset(wc.method, stage)
    inputs = {
        "model": start_model(wc.method, wc.lr, stage),
        "data": train_file(dataset),
        "index": data_index(dataset),
    }
    if method_options(wc.method).get("osft"):
        inputs["svd"] = svd_dir(wc.method, wc.lr, stage)
    return inputs


def all_eval_jsons():
    return [eval_json(source, task) for source in eval_sources() for task in config["stages"]]


def manifest_inputs():
    return {
        "evals": all_eval_jsons(),
        "runs": [final_dir(m, lr, s) for m, lr, s in sweep()],
        "summaries": [data_summary(task) for task in config["stages"]],
    }


def manifest_flags():
    """The manifest's entries as `mini-trainer manifest` flags (see CONTRACTS: MANIFEST.json)."""
    parts = [f"--task {shlex.quote(task)}" for task in config["stages"]]
    for source in eval_sources():
        parsed = parse_source(source)
        method, lr, stage = parsed if parsed else ("-", "-", 0)
        for task in config["stages"]:
            fields = [eval_json(source, task), method, lr, str(stage), task]
            parts.append(f"--eval {shlex.join(fields)}")
    for method, lr, stage in sweep():
        fields = [run_dir(method, lr, stage), method, lr, str(stage)]
        parts.append(f"--run {shlex.join(fields)}")
    for task in config["stages"]:
        parts.append(f"--data-summary {shlex.quote(data_summary(task))} {shlex.quote(task)}")
    return " ".join(parts)


_check_config()
