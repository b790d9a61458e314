"""How rules call the package: command-line flags, the manifest's entries, job resources.

Pure functions of the config (see `layout`); the rule files only place their results.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from mini_trainer.manifest import BASE_MARK
from mini_trainer.methods import method_label
from mini_trainer.pipeline.data import is_multitask
from mini_trainer.pipeline.hub import model_flags, model_input
from mini_trainer.pipeline.interpolation import interpolated_series
from mini_trainer.pipeline.layout import (
    Config,
    PipelineError,
    all_eval_jsons,
    base_model,
    data_index,
    data_summary,
    eval_json,
    eval_sources,
    evaluated_source,
    final_dir,
    method_options,
    mix_inputs,
    parse_source,
    run_dir,
    run_key,
    selected_method,
    stage_dataset,
    start_model,
    svd_dir,
    sweep,
    train_file,
    training_options,
    uses_method,
    validation_file,
)
from mini_trainer.pipeline.planning import plan_file, plan_needed, plan_training_options
from mini_trainer.pipeline.trace import trace_score_flags, trace_scores
from mini_trainer.training_args import NEGATABLE


def eval_pairs(data_files: list[str], out_files: list[str]) -> str:
    """`--data D1 --out O1 --data D2 --out O2 ...`: one evaluate job scores every file
    (unequal lists are a ValueError)."""
    return " ".join(
        f"--data {shlex.quote(str(d))} --out {shlex.quote(str(o))}"
        for d, o in zip(data_files, out_files, strict=True)
    )


def cli_flags(options: dict[str, Any]) -> str:
    """`{"batch_size": 8, "osft": True, "p": ["a", "b"]}` -> `--batch-size 8 --osft --p a b`;
    False is `--no-NAME` for an option that has that flag (`async_save`), else left out."""
    parts = []
    for name, value in sorted(options.items()):
        flag = f"--{name.replace('_', '-')}"
        if value is False and name in NEGATABLE:
            parts.append(f"--no-{name.replace('_', '-')}")
            continue
        if value is None or value is False:
            continue
        if value is True:
            parts.append(flag)
        elif isinstance(value, list):
            parts += [flag, *map(str, value)]
        else:
            parts += [flag, str(value)]
    return " ".join(shlex.quote(p) for p in parts)


def plan_flags(config: Config, method: str) -> str:
    """The flags of `mini-trainer plan` for `method` on the configured GPUs, `--require-fit`
    included (exit status 4 when the peak does not fit)."""
    launch = config["launch"]
    parts = [
        model_flags(config, base_model(config)),
        f"--nodes {launch['nodes']}",
        f"--gpus-per-node {launch['gpus_per_node']}",
        f"--gpu-memory-gib {launch['gpu_memory_gib']}",
    ]
    if launch.get("gpu"):
        parts.append(f"--gpu {shlex.quote(launch['gpu'])}")
    parts += ["--require-fit", cli_flags(plan_training_options(config, method))]
    return " ".join(parts)


def torchrun_launcher(config: Config) -> str:
    """How a training job starts its processes: `mini-trainer launch` (docs/slurm.md).

    Outside Slurm it is one standalone torchrun; in a Slurm job it starts one torchrun per node
    through srun, with the rendezvous on the allocation's first host, so one rule serves 1 or N
    nodes.
    """
    nproc = config["launch"]["nproc_per_node"]
    return f'"$MINI_TRAINER_PYTHON" -m mini_trainer launch --nproc-per-node {nproc} --'


def train_node_resources(config: Config) -> dict[str, Any]:
    """Slurm resources of a training job: N nodes, one task (one torchrun) per node.

    srun inside the job needs `mpi="srun"` for several tasks (the plugin refuses it for one);
    GPUs are asked per node with gres, as the plugin's `gpu` would be per job.
    """
    nodes = config["launch"]["nodes"]
    gpus = config["launch"]["gpus_per_node"]
    resources: dict[str, Any] = {"nodes": nodes, "tasks": nodes}
    if nodes > 1:
        resources["mpi"] = "srun"
    if gpus:
        resources.update(gres=f"gpu:{gpus}", tasks_per_gpu=0)
    return resources


def drop_states_resource(config: Config) -> int:
    """1 when training jobs delete their states once final/ is written (the train rule sets
    MINI_TRAINER_DROP_STATES to it; `launch` then adds `--drop-states-after-final`), 0 with
    `keep_states_after_final: true`.

    A Snakemake resource of the train rule, not a parameter or a flag of its `params`: Snakemake
    reruns a job whose parameters changed, and a finished run whose states are gone would then
    train again from step 1. So changing the key reruns nothing; it applies to the jobs that run
    afterwards (and does not bring back states already dropped)."""
    return 0 if config.get("keep_states_after_final", False) else 1


def train_threads(config: Config) -> int:
    """CPU slots a training job takes: one per process on CPU, else the configured threads."""
    configured = config["resources"].get("train", {}).get("threads")
    return configured or config["launch"]["nproc_per_node"]


def rule_threads(config: Config, rule: str, default: int = 1) -> int:
    return config["resources"].get(rule, {}).get("threads", default)


def rule_resource(config: Config, rule: str, name: str) -> Any:
    return config["resources"][rule][name]


def train_inputs(config: Config, method: str, lr: str, stage: int, key: str) -> dict[str, str]:
    """Inputs of the train job whose output folder has run key `key`.

    A folder of an older key (options changed since) is refused rather than trained: its key
    would not describe what the job does.
    """
    current = run_key(config, method, lr, stage)
    if key != current:
        raise PipelineError(
            f"results/train/{method}/lr{lr}/stage{stage}/{key}: no longer matches the "
            f"config (its run key is now {current})"
        )
    shared = run_dir(config, method, lr, stage)
    if shared != f"results/train/{method}/lr{lr}/stage{stage}/{key}":
        raise PipelineError(
            f"results/train/{method}/lr{lr}/stage{stage}/{key}: the same run as {shared} "
            "(same run key), which trains it"
        )
    dataset = stage_dataset(config, method, stage)
    inputs = {
        "model": model_input(config, start_model(config, method, lr, stage)),
        "data": train_file(config, dataset),
        "index": data_index(dataset),
    }
    task = config["stages"][stage - 1]
    if validation_file(config, task):
        inputs["validation"] = validation_file(config, task)
    options = method_options(config, method)
    if uses_method(options, "osft"):
        inputs["svd"] = svd_dir(config, method, lr, stage)
    if uses_method(options, "ewc") and stage > 1:
        inputs["fisher"] = training_options(config, method, lr, stage)["ewc_fisher"]
    if plan_needed(config):  # GPU jobs wait for their method's plan (planning.py)
        inputs["plan"] = plan_file(method)
    return inputs


def mix_flags(config: Config, name: str) -> str:
    """`--input FILE WEIGHT ... --replay FILE FRACTION ...` of the mixture `mix/{name}`."""
    flags = {"weight": "--input", "replay": "--replay"}
    return " ".join(
        f"{flags[kind]} {shlex.quote(path)} {value}"
        for path, kind, value in mix_inputs(config, name)
    )


def mix_input_files(config: Config, name: str) -> list[str]:
    return [path for path, _, _ in mix_inputs(config, name)]


def summarized_datasets(config: Config) -> list[tuple[str, str]]:
    """(dataset, its stage's task) of every training file the report's Data section shows:
    each task's file, then each mixture some stage trains on (a stage mixture, replay)."""
    datasets = {task: task for task in config["stages"]}
    for method, _, stage in sweep(config):
        datasets.setdefault(stage_dataset(config, method, stage), config["stages"][stage - 1])
    return list(datasets.items())


def manifest_inputs(config: Config) -> dict[str, list[str]]:
    return {
        "evals": all_eval_jsons(config),
        "runs": [final_dir(config, m, lr, s) for m, lr, s in sweep(config)],
        "summaries": [data_summary(dataset) for dataset, _ in summarized_datasets(config)],
        "scores": [path for path, _ in trace_scores(config)],
    }


def manifest_flags(config: Config) -> str:
    """The manifest's entries as `mini-trainer manifest` flags (`manifest.py` owns the format)."""
    parts = [f"--task {shlex.quote(task)}" for task in config["stages"]]
    for source in eval_sources(config):
        parsed = parse_source(source)
        method, lr, stage = parsed if parsed else (BASE_MARK, BASE_MARK, 0)
        for task in config["stages"]:
            path = eval_json(evaluated_source(config, source), task)
            fields = [path, method, lr, str(stage), task]
            parts.append(f"--eval {shlex.join(fields)}")
    for method, lr, stage in sweep(config):
        fields = [run_dir(config, method, lr, stage), method, lr, str(stage)]
        parts.append(f"--run {shlex.join(fields)}")
    for dataset, task in summarized_datasets(config):
        parts.append(f"--data-summary {shlex.quote(data_summary(dataset))} {shlex.quote(task)}")
    for fields in trace_score_flags(config):
        parts.append(f"--score {shlex.join(fields)}")
    for fields in benchmark_files(config):
        parts.append(f"--benchmark {shlex.join(fields)}")
    for name, info in method_infos(config).items():
        parts.append(f"--method-info {shlex.quote(name)} {shlex.quote(json.dumps(info))}")
    return " ".join(parts)


def benchmark_files(config: Config) -> list[list[str]]:
    """(path, method, lr, stage) of the Snakemake benchmark file of each job done for a cell:
    its training (a run two methods share is listed for both), the EWC Fisher taken from its
    final weights, and each weight interpolation of an interpolated series (the report's wall
    time per method; the rules' `benchmark:` paths)."""
    files = []
    for method, lr, stage in sweep(config):
        run = run_dir(config, method, lr, stage).removeprefix("results/train/")
        files.append([f"results/benchmarks/train/{run}.tsv", method, lr, str(stage)])
        if uses_method(method_options(config, method), "ewc") and stage < len(config["stages"]):
            files.append([f"results/benchmarks/ewc_fisher/{run}.tsv", method, lr, str(stage)])
    for series, (method, pct) in interpolated_series(config).items():
        for trained, lr, stage in sweep(config):
            if trained == method:
                run = run_dir(config, method, lr, stage).removeprefix("results/train/")
                path = f"results/benchmarks/interpolate/{run}/wise{pct}.tsv"
                files.append([path, series, lr, str(stage)])
    return files


def method_infos(config: Config) -> dict[str, dict]:
    """Each series of the report (a method entry, an interpolated series) described: its
    registered method's report label, that method's name, its settings as configured (its
    entry less the learning rates, `training` overrides inlined) and whether it is the
    multi-task bound (`manifest.METHOD_INFO_FIELDS`)."""
    infos = {}
    for method, entry in config["methods"].items():
        registered = selected_method(method_options(config, method))
        settings = {k: v for k, v in entry.items() if k not in ("learning_rates", "training")}
        settings.pop("method", None)
        settings.update(entry.get("training", {}))
        infos[method] = {"label": method_label(registered), "method": registered,
                         "settings": settings, "bound": is_multitask(config, method)}  # fmt: skip
    for series, (method, pct) in interpolated_series(config).items():
        infos[series] = {**infos[method], "bound": False,
                         "settings": {"interpolated_from": method, "alpha": pct / 100}}  # fmt: skip
    return infos
