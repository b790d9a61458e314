"""The pipeline's logic (mini_trainer/pipeline/) as pure functions: no Snakemake run.

Configs are read and completed with their defaults by Snakemake's own `validate` against the
committed schema, as the Snakefile does; tests/test_pipeline.py runs the real workflow.
"""

from __future__ import annotations

import copy
import dataclasses
import shlex
import subprocess
import sys
import typing

import pytest
import yaml
from helpers import REPO_ROOT, subprocess_env
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from mini_trainer import pipeline
from mini_trainer.errors import UserError
from mini_trainer.methods import METHODS
from mini_trainer.pipeline import schema
from mini_trainer.training_args import TrainingArgs

SCHEMA = str(REPO_ROOT / "workflow/schemas/config.schema.yaml")
REQUIRED = {"model_name_or_path": "m", "data_path": "d.jsonl", "output_dir": "out"}


def load(config: dict) -> dict:
    """`config` as the Snakefile sees it: validated, defaults filled in."""
    config = copy.deepcopy(config)
    validate(config, SCHEMA)
    return config


@pytest.fixture
def demo() -> dict:
    """The embedded default (config/config.yaml): 2 methods x 2 rates x 3 stages."""
    return load(yaml.safe_load((REPO_ROOT / "config/config.yaml").read_text()))


def small(**training) -> dict:
    """One SFT method, one rate, two stages; `training` adds shared options."""
    return load(
        {
            "model": "demo",
            "stages": ["sort", "sort_desc"],
            "training": {"max_tokens_per_gpu": 2048, **training},
            "methods": {"sft": {"learning_rates": [0.01]}},
        }
    )


# ---------------------------------------------------------------------------------------------
# Names, paths, run keys.


def test_run_keys_of_the_default_config_are_unchanged(demo):
    """Run keys name existing run folders: the values workflow/rules/common.smk computed before
    the logic moved into the package (a change here makes every run start over)."""
    assert (
        pipeline.run_dir(demo, "sft", "0.003", 1) == "results/train/sft/lr0.003/stage1/4a6f81bd52"
    )
    assert (
        pipeline.run_dir(demo, "osft", "0.03", 3) == "results/train/osft/lr0.03/stage3/0e3199e95a"
    )


def test_runs_with_equal_keys_are_one_run(demo):
    """Replay's stage 1 has SFT's options at the same rate (no earlier stage to replay): same
    run key, so it is SFT's run folder, trained once; its later stages start from it."""
    sft1 = pipeline.run_dir(demo, "sft", "0.01", 1)
    assert pipeline.run_dir(demo, "replay", "0.01", 1) == sft1
    assert pipeline.training_options(demo, "replay", "0.01", 1) == pipeline.training_options(
        demo, "sft", "0.01", 1
    )
    assert pipeline.start_model(demo, "replay", "0.01", 2) == f"{sft1}/final"
    replay2 = pipeline.run_dir(demo, "replay", "0.01", 2)
    assert replay2.startswith("results/train/replay/lr0.01/stage2/")
    assert replay2 != pipeline.run_dir(demo, "sft", "0.01", 2)
    # The shared run's folder under replay/ is not a job of its own.
    key = pipeline.run_key(demo, "replay", "0.01", 1)
    with pytest.raises(WorkflowError, match=f"the same run as {sft1}"):
        pipeline.train_inputs(demo, "replay", "0.01", 1, key)
    assert pipeline.train_inputs(demo, "sft", "0.01", 1, key)["model"] == "resources/demo/model"
    # Its evaluations are SFT's: evaluated once, both rows of the manifest point at them.
    assert pipeline.evaluated_source(demo, "replay/lr0.01/stage1") == "sft/lr0.01/stage1"
    assert pipeline.evaluated_source(demo, "replay/lr0.01/stage2") == "replay/lr0.01/stage2"
    assert "results/eval/replay/lr0.01/stage1/sort.json" not in pipeline.all_eval_jsons(demo)
    words = shlex.split(pipeline.manifest_flags(demo))
    rows = [words[i + 1 : i + 6] for i, w in enumerate(words) if w == "--eval"]
    assert ["results/eval/sft/lr0.01/stage1/sort.json", "replay", "0.01", "1", "sort"] in rows
    # Different options (another rate) are not shared.
    other = copy.deepcopy(demo)
    other["methods"]["replay"]["learning_rates"] = [0.02]
    assert pipeline.run_dir(other, "replay", "0.02", 1).startswith("results/train/replay/")


def test_sweep_and_learning_rates(demo):
    runs = pipeline.sweep(demo)
    assert len(runs) == 2 * 2 * 3 + 3 and ("osft", "0.03", 3) in runs  # + replay at one lr
    assert pipeline.lr_str(1e-5) == "1e-05" and pipeline.lr_value(demo, "osft", "0.03") == 0.03
    with pytest.raises(WorkflowError, match="not in config: methods.sft.learning_rates"):
        pipeline.lr_value(demo, "sft", "0.5")
    with pytest.raises(WorkflowError, match="unknown method 'dpo'"):
        pipeline.lr_value(demo, "dpo", "0.01")


def test_stages_chain_through_final_dirs(demo):
    assert pipeline.start_model(demo, "sft", "0.01", 1) == "resources/demo/model"
    stage2 = pipeline.start_model(demo, "sft", "0.01", 2)
    assert stage2 == pipeline.final_dir(demo, "sft", "0.01", 1)
    assert stage2 == pipeline.run_dir(demo, "sft", "0.01", 1) + "/final"


def test_run_key_follows_options_and_upstream_stages():
    before = small(max_steps=10, training_mode="step")
    keys = {s: pipeline.run_key(before, "sft", "0.01", s) for s in (1, 2)}
    other_task = copy.deepcopy(before)
    other_task["stages"][1] = "sort_plus1"
    assert pipeline.run_key(other_task, "sft", "0.01", 1) == keys[1]
    assert pipeline.run_key(other_task, "sft", "0.01", 2) != keys[2]
    more_steps = small(max_steps=11, training_mode="step")
    assert all(pipeline.run_key(more_steps, "sft", "0.01", s) != keys[s] for s in (1, 2))
    geometry = copy.deepcopy(before)
    geometry["launch"]["nproc_per_node"] = 4
    assert pipeline.run_key(geometry, "sft", "0.01", 1) != keys[1]
    assert len(keys[1]) == pipeline.RUN_KEY_LENGTH


def test_training_options_merge_method_over_shared(demo):
    options = pipeline.training_options(demo, "osft", "0.01", 2)
    assert options["batch_size"] == 32 and options["osft_unfreeze_rank_ratio"] == 0.25
    assert options["learning_rate"] == 0.01 and options["save_final_checkpoint"] is True
    assert options["data_path"] == "resources/demo/data/sort_desc.train.jsonl"
    assert options["data_index"] == "results/data/sort_desc.train.index.parquet"
    assert options["osft_svd_cache"] == pipeline.svd_dir(demo, "osft", "0.01", 2)
    assert "osft" not in pipeline.training_options(demo, "sft", "0.01", 1)
    wandb = copy.deepcopy(demo)
    wandb["training"]["wandb_project"] = "p"
    named = pipeline.training_options(wandb, "sft", "0.003", 3)["wandb_run_name"]
    assert named == "sft-lr0.003-stage3-sort_plus1"


def test_finished_runs_drop_their_states_unless_the_config_keeps_them(demo):
    """A job drops its states once final/ is written (keep_states_after_final: false, the
    default). The choice is a resource of the train job: no run key, flag or parameter changes,
    so changing it reruns no finished job (whose states are gone)."""
    assert pipeline.drop_states_resource(demo) == 1
    kept = load({**demo, "keep_states_after_final": True})
    assert pipeline.drop_states_resource(kept) == 0
    for run in pipeline.sweep(demo):
        assert pipeline.run_dir(kept, *run) == pipeline.run_dir(demo, *run)
        assert pipeline.training_options(kept, *run) == pipeline.training_options(demo, *run)


def test_svd_folders_are_named_after_their_weights(demo):
    assert pipeline.svd_dir(demo, "osft", "0.01", 1) == "results/osft_svd/base/default-targets"
    assert pipeline.svd_dir(demo, "osft", "0.03", 1) == pipeline.svd_dir(demo, "osft", "0.01", 1)
    stage2 = pipeline.svd_dir(demo, "osft", "0.01", 2)
    source = pipeline.run_dir(demo, "osft", "0.01", 1).removeprefix("results/train/")
    assert stage2 == f"results/osft_svd/{source}/default-targets"
    assert pipeline.svd_model(demo, source) == pipeline.final_dir(demo, "osft", "0.01", 1)
    assert pipeline.svd_model(demo, "base") == "resources/demo/model"
    patterns = copy.deepcopy(demo)
    patterns["methods"]["osft"]["training"]["osft_target_patterns"] = ["q_proj", "v_proj"]
    targets = pipeline.svd_targets_key(pipeline.method_options(patterns, "osft"))
    assert targets.startswith("targets-") and pipeline.svd_dir(
        patterns, "osft", "0.01", 1
    ).endswith(targets)
    assert pipeline.svd_target_patterns(patterns, targets) == ["q_proj", "v_proj"]
    assert pipeline.svd_target_patterns(demo, "default-targets") == []
    with pytest.raises(WorkflowError, match="no OSFT method"):
        pipeline.svd_target_patterns(demo, targets)


def test_evaluation_sources_round_trip(demo):
    sources = pipeline.eval_sources(demo)
    assert sources[0] == "base" and len(sources) == 1 + 15
    for source in sources[1:]:
        method, lr, stage = pipeline.parse_source(source)
        assert pipeline.eval_model(demo, source) == pipeline.final_dir(demo, method, lr, stage)
    assert pipeline.eval_model(demo, "base") == "resources/demo/model"
    assert len(pipeline.all_eval_jsons(demo)) == 15 * 3  # replay/lr0.01/stage1 is sft's
    assert (
        pipeline.eval_json("sft/lr0.01/stage2", "sort")
        == "results/eval/sft/lr0.01/stage2/sort.json"
    )
    for bad in ("sft/0.01/stage2", "sft/lr0.01", "sft/lr0.01/stagex"):
        with pytest.raises(WorkflowError, match="not an evaluation source"):
            pipeline.parse_source(bad)


def test_task_files_demo_and_configured(demo):
    assert pipeline.task_file(demo, "sort", "eval") == "resources/demo/data/sort.eval.jsonl"
    config = copy.deepcopy(demo)
    config["tasks"] = {"mine": {"train": "d/t.jsonl", "eval": "d/e.jsonl"}}
    assert pipeline.task_file(config, "mine", "train") == "d/t.jsonl"
    config["model"] = "models/x"
    assert pipeline.base_model(config) == "models/x"


# ---------------------------------------------------------------------------------------------
# Command lines, manifest, resources.


def test_cli_flags():
    flags = pipeline.cli_flags({"batch_size": 8, "osft": True, "cpu_offload": False,
                                "p": ["a b", "c"], "max_steps": None})  # fmt: skip
    assert shlex.split(flags) == ["--batch-size", "8", "--osft", "--p", "a b", "c"]


def test_train_inputs_refuse_a_stale_key(demo):
    key = pipeline.run_key(demo, "osft", "0.01", 2)
    inputs = pipeline.train_inputs(demo, "osft", "0.01", 2, key)
    assert inputs["model"] == pipeline.final_dir(demo, "osft", "0.01", 1)
    assert inputs["svd"] == pipeline.svd_dir(demo, "osft", "0.01", 2)
    assert "svd" not in pipeline.train_inputs(
        demo, "sft", "0.01", 1, pipeline.run_key(demo, "sft", "0.01", 1)
    )
    with pytest.raises(WorkflowError, match="no longer matches the config"):
        pipeline.train_inputs(demo, "osft", "0.01", 2, "0123456789")


def test_manifest_entries_cover_every_cell(demo):
    words = shlex.split(pipeline.manifest_flags(demo))
    # Each task's training file and each mixture a stage trains on (replay's stages 2 and 3).
    assert words.count("--task") == 3 and words.count("--data-summary") == 3 + 2
    summaries = [words[i + 1 : i + 3] for i, w in enumerate(words) if w == "--data-summary"]
    assert summaries[3:] == [
        [pipeline.data_summary("mix/sort_desc-replay0.25"), "sort_desc"],
        [pipeline.data_summary("mix/sort_plus1-replay0.25"), "sort_plus1"],
    ]
    assert words.count("--eval") == 16 * 3 and words.count("--run") == 15
    at = words.index("--run")
    assert words[at + 1 : at + 5] == [
        pipeline.run_dir(demo, "sft", "0.003", 1),
        "sft",
        "0.003",
        "1",
    ]
    at = words.index("--eval")
    assert words[at + 1 : at + 6] == ["results/eval/base/sort.json", "-", "-", "0", "sort"]
    inputs = pipeline.manifest_inputs(demo)
    assert len(inputs["runs"]) == 15 and len(inputs["evals"]) == 45
    assert inputs["summaries"] == [path for path, _ in summaries]
    assert inputs["summaries"][0] == pipeline.data_summary("sort")


def test_resources(demo):
    assert pipeline.train_node_resources(demo) == {"nodes": 1, "tasks": 1}
    assert pipeline.train_threads(demo) == 2 and pipeline.rule_threads(demo, "evaluate") == 1
    assert pipeline.rule_resource(demo, "train", "mem_mb") == 8000
    big = copy.deepcopy(demo)
    big["launch"].update(nodes=2, gpus_per_node=8, nproc_per_node=8)
    big["resources"]["train"] = {"mem_mb": 1, "runtime": 1, "threads": 16}
    assert pipeline.train_node_resources(big) == {
        "nodes": 2, "tasks": 2, "mpi": "srun", "gres": "gpu:8", "tasks_per_gpu": 0
    }  # fmt: skip
    assert pipeline.train_threads(big) == 16
    assert "--nproc-per-node 8 --" in pipeline.torchrun_launcher(big)


PLAN_MODEL = str(REPO_ROOT / "tests/fixtures/plan/llama-3.1-8b")


def gpu_example(**launch) -> dict:
    """The 8-GPU example on a local model folder (the plan fixture: config.json only)."""
    config = pipeline.read_config_file(REPO_ROOT / "config/examples/llama-3.1-8b-8gpu.yaml")
    config["model"] = PLAN_MODEL
    config["launch"].update(launch)
    return load(config)


def test_plan_only_with_gpus(demo):
    """CPU configs have no plan: train inputs as before; GPU configs wait for the method's."""
    assert not pipeline.plan_needed(demo)
    key = pipeline.run_key(demo, "sft", "0.01", 1)
    assert "plan" not in pipeline.train_inputs(demo, "sft", "0.01", 1, key)
    gpu = gpu_example()
    assert pipeline.plan_needed(gpu)
    for method, lr, stage in pipeline.sweep(gpu):
        key = pipeline.run_key(gpu, method, lr, stage)
        inputs = pipeline.train_inputs(gpu, method, lr, stage, key)
        assert inputs["plan"] == pipeline.plan_file(method) == f"results/plan/{method}.txt"


def test_plan_flags_are_the_methods_options_on_the_configured_gpus():
    config = gpu_example(nodes=2, gpus_per_node=4, gpu_memory_gib=79.5)
    words = shlex.split(pipeline.plan_flags(config, "osft"))
    assert words[:9] == ["--model", PLAN_MODEL, "--nodes", "2", "--gpus-per-node", "4",
                         "--gpu-memory-gib", "79.5", "--gpu"]  # fmt: skip
    assert words[9] == "H100" and "--require-fit" in words and "--model-revision" not in words
    at = words.index("--max-tokens-per-gpu")
    assert words[at + 1] == "16384"
    at = words.index("--osft-unfreeze-rank-ratio")
    assert words[at + 1] == "0.25" and "--activation-checkpointing" in words
    sft = shlex.split(pipeline.plan_flags(config, "sft"))
    assert "--osft" not in sft and "--use-liger-kernels" in sft
    for flag in ("--learning-rate", "--data-path", "--output-dir", "--model-name-or-path"):
        assert flag not in sft  # the plan fills what it does not need
    del config["launch"]["gpu"]
    assert "--gpu" not in shlex.split(pipeline.plan_flags(config, "sft"))


def test_plan_parses_the_pipelines_flags_as_train_does():
    """Every method's plan flags are accepted by `plan`'s parser (train's), validation options
    (which need the job's validation file) left out."""
    from pathlib import Path

    from mini_trainer.plan.inputs import training_args

    config = gpu_example()
    config["methods"]["sft"]["training"] = {"validation_every_steps": 10, "best_metric": "loss"}
    options = pipeline.plan_training_options(config, "sft")
    assert "validation_every_steps" not in options and "best_metric" not in options
    for method in config["methods"]:
        words = shlex.split(pipeline.plan_flags(config, method))
        flags = words[words.index("--require-fit") + 1 :]
        args = training_args(Path(PLAN_MODEL), flags)
        assert args.max_tokens_per_gpu == 16384 and args.batch_size == 128
        assert args.osft == (method == "osft")


@pytest.mark.parametrize(
    ("launch", "message"),
    [
        ({"gpu_memory_gib": None}, "config: launch.gpu_memory_gib: required with gpus_per_node 8"),
        ({"gpu": "Q9000"}, "config: launch.gpu: unknown GPU name 'Q9000'"),
    ],
)
def test_gpu_configs_need_the_gpu_memory(launch, message):
    config = gpu_example()
    for name, value in launch.items():
        if value is None:
            del config["launch"][name]
        else:
            config["launch"][name] = value
    with pytest.raises(pipeline.ConfigError) as caught:
        pipeline.check_config(config)
    assert str(caught.value).startswith(message)


def test_demo_tasks_match_the_package():
    from mini_trainer.demo.tasks import TASKS

    assert list(TASKS) == pipeline.DEMO_TASKS


# ---------------------------------------------------------------------------------------------
# Config checks: the pipeline refuses what the engine refuses, at config time.


def test_default_and_example_configs_pass(demo):
    pipeline.check_config(demo)
    for name in ("demo-sft.yaml", "llama-3.1-8b-8gpu.yaml"):
        config = load(pipeline.read_config_file(REPO_ROOT / "config/examples" / name))
        pipeline.check_config(config)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stages": ["sort", "sortt"]}, "config: stages[1]: unknown task 'sortt'"),
        ({"training": {"batch_size": 4}}, "config: training.max_tokens_per_gpu: required"),
        ({"methods": {"m": {"learning_rates": [0.1], "training": {"max_tokens_per_gpu": 8}}}},
         "config: methods.m.training.max_tokens_per_gpu: 8 is below"),
        ({"methods": {"m": {"learning_rates": [0.1, 0.10]}}},
         "config: methods.m.learning_rates: has the same rate twice"),
    ],
)  # fmt: skip
def test_cross_key_checks(demo, change, message):
    config = {**demo, **change}
    with pytest.raises(pipeline.ConfigError) as caught:
        pipeline.check_config(config)
    assert str(caught.value).startswith(message)


def test_data_is_validated_against_a_context_parallel_groups_row(demo):
    """With training.context_parallel N, `validate` keeps samples up to N x the rank cap, and a
    method's own row budget may not be smaller (docs/context_parallel.md)."""
    config = copy.deepcopy(demo)
    config["training"]["context_parallel"] = 4
    cap = config["training"]["max_tokens_per_gpu"]
    assert pipeline.data_token_cap(demo) == cap and pipeline.data_token_cap(config) == 4 * cap
    config["methods"]["sft"].setdefault("training", {})["context_parallel"] = 2
    with pytest.raises(pipeline.ConfigError) as caught:
        pipeline.check_config(config)
    assert str(caught.value).startswith(
        f"config: methods.sft.training.max_tokens_per_gpu: {2 * cap} is below "
        f"training.max_tokens_per_gpu x training.context_parallel ({4 * cap})"
    )


def test_warmup_longer_than_max_steps_is_refused_naming_method_and_key(demo):
    shared = copy.deepcopy(demo)
    shared["training"]["num_warmup_steps"] = 100  # max_steps: 80
    with pytest.raises(pipeline.ConfigError) as caught:
        pipeline.check_config(shared)
    assert str(caught.value) == (
        "config: training.num_warmup_steps (method sft): 100 is more than max_steps 80 "
        "(the learning rate would never reach its peak)"
    )
    own = copy.deepcopy(demo)
    own["methods"]["osft"]["training"]["max_steps"] = 4
    with pytest.raises(
        pipeline.ConfigError,
        match=r"^config: training\.num_warmup_steps \(method osft\): 8 is more than max_steps 4 ",
    ):
        pipeline.check_config(own)
    own["methods"]["osft"]["training"]["num_warmup_steps"] = 5
    with pytest.raises(
        pipeline.ConfigError, match=r"^config: methods\.osft\.training\.num_warmup_steps: 5 is"
    ):
        pipeline.check_config(own)
    assert "\n" not in str(caught.value)


OSFT = {"osft": True}
CASES = {
    "adaptive OSFT without a ratio": {**OSFT, "osft_rank_mode": "adaptive"},
    "uniform OSFT without a ratio": OSFT,
    "uniform OSFT with a ratio": {**OSFT, "osft_unfreeze_rank_ratio": 0.5},
    "an OSFT option without osft": {"osft_rank_mode": "adaptive"},
    "frozen ratios crossed": {**OSFT, "osft_rank_mode": "adaptive",
                              "osft_min_frozen_ratio": 0.9, "osft_max_frozen_ratio": 0.2},
    "adaptive ratios in uniform mode": {**OSFT, "osft_unfreeze_rank_ratio": 0.5,
                                        "osft_min_frozen_ratio": 0.2},
    "nothing trains": {**OSFT, "osft_unfreeze_rank_ratio": 0.0, "osft_freeze_non_targets": True},
    "warm-up over max_steps": {"training_mode": "step", "max_steps": 5, "num_warmup_steps": 6},
    "warm-up equal to max_steps": {"training_mode": "step", "max_steps": 5, "num_warmup_steps": 5},
    "step mode without max_steps": {"training_mode": "step"},
}  # fmt: skip


@pytest.mark.parametrize("options", CASES.values(), ids=CASES.keys())
def test_pipeline_and_engine_agree(options):
    """The same options are accepted by both the engine and the pipeline, or refused by both."""
    try:
        TrainingArgs(**REQUIRED, **options)
        engine_accepts = True
    except UserError:
        engine_accepts = False
    config = small()
    config["methods"]["sft"]["training"] = options
    try:
        pipeline.check_config(config)
        pipeline_accepts = True
    except pipeline.ConfigError:
        pipeline_accepts = False
    assert pipeline_accepts == engine_accepts


def test_adaptive_osft_without_a_ratio_is_accepted_by_both():
    TrainingArgs(**REQUIRED, osft=True, osft_rank_mode="adaptive")
    config = small()
    config["methods"]["sft"]["training"] = {"osft": True, "osft_rank_mode": "adaptive"}
    pipeline.check_config(config)
    config["methods"]["sft"]["training"] = {"osft": True}
    with pytest.raises(pipeline.ConfigError) as caught:
        pipeline.check_config(config)
    assert str(caught.value) == (
        "config: methods.sft.training.osft_unfreeze_rank_ratio: required with osft"
    )


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("model: demo\nstages: [sort\ntraining:\n  batch_size: 4\n")
    with pytest.raises(pipeline.ConfigError) as caught:
        pipeline.read_config_file(path)
    assert str(caught.value).startswith(f"{path}:3: YAML syntax error: ")
    path.write_text("model: demo\ntraining:\n  batch_size: 4\n   seed: 1\n")
    with pytest.raises(pipeline.ConfigError, match=rf"^{path}:4: YAML syntax error: "):
        pipeline.read_config_file(path)
    path.write_text("model: demo\n")
    assert pipeline.read_config_file(path) == {"model": "demo"}


# ---------------------------------------------------------------------------------------------
# The schema's training options are generated from TrainingArgs.


def test_committed_schema_and_readme_are_generated():
    """Fails after a TrainingArgs change until `python -m mini_trainer.pipeline.schema --write`."""
    for path, text in schema.generated_files(REPO_ROOT).items():
        assert path.read_text() == text, f"{path} is stale: run {schema.COMMAND}"
    assert schema.main(["--check"]) == 0


def test_options_are_the_fields_the_pipeline_does_not_set():
    committed = yaml.safe_load((REPO_ROOT / schema.SCHEMA_FILE).read_text())
    options = committed["$defs"]["training_options"]["properties"]
    fields = [f.name for f in dataclasses.fields(TrainingArgs)]
    assert list(options) == [f for f in fields if f not in schema.SET_BY_PIPELINE]
    assert set(schema.SET_BY_PIPELINE) <= set(fields)
    set_here = set(pipeline.training_options(small(), "sft", "0.01", 1))
    # The train rule adds the output folder, --resume and --drop-states-after-final (from its
    # drop_states resource); OSFT, EWC (stage 2 on), wandb, a validation file and a Hub model
    # (its commit) add the others.
    assert set(schema.SET_BY_PIPELINE) - set_here == {
        "output_dir", "resume", "osft_svd_cache", "ewc_fisher", "wandb_run_name",
        "validation_data_path", "save_best", "model_revision", "drop_states_after_final",
    }  # fmt: skip


VALIDATION_FIELDS = ("validation_every_steps", "validation_max_tokens_per_gpu", "save_best",
                     "best_metric", "early_stopping_patience",
                     "early_stopping_min_delta")  # fmt: skip


def _outside(bound: str, value: float, kind: type) -> float:
    step = 1 if kind is int else 1e-9
    return {"minimum": value - step, "exclusive_minimum": value,
            "maximum": value + step, "exclusive_maximum": value}[bound]  # fmt: skip


def _base_for(name: str) -> dict:
    """Valid options around field `name` (OSFT ones need OSFT on, in adaptive mode; validation
    ones a validation file)."""
    if name in VALIDATION_FIELDS:
        return {**REQUIRED, "validation_data_path": "v.jsonl"}
    for group in METHODS.values():  # another method's options need that method
        if group.name != "osft" and name in {f.name for f in group.own_fields()}:
            return {**REQUIRED, "method": group.name}
    if not name.startswith("osft_"):
        return dict(REQUIRED)
    return {**REQUIRED, "osft": True, "osft_rank_mode": "adaptive", "osft_unfreeze_rank_ratio": 0.5,
            "osft_min_frozen_ratio": 0.0, "osft_max_frozen_ratio": 1.0}  # fmt: skip


BOUNDED = [
    (f.name, bound, f.metadata[bound])
    for f in dataclasses.fields(TrainingArgs)
    for bound in ("minimum", "maximum", "exclusive_minimum", "exclusive_maximum")
    if bound in f.metadata
]


@pytest.mark.parametrize(("name", "bound", "value"), BOUNDED)
def test_the_engine_enforces_every_generated_bound(name, bound, value):
    """The bounds the schema is generated from are the engine's: just outside is refused, the
    bound itself (when inclusive) is accepted."""
    kind = typing.get_type_hints(TrainingArgs)[name]
    kind = int if kind in (int, int | None) else float
    with pytest.raises(UserError, match=f"--{name.replace('_', '-')}"):
        TrainingArgs(**{**_base_for(name), name: kind(_outside(bound, value, kind))})
    if not bound.startswith("exclusive"):
        TrainingArgs(**{**_base_for(name), name: kind(value)})


CHOICES = [(f.name, f.metadata["choices"]) for f in dataclasses.fields(TrainingArgs)
           if "choices" in f.metadata]  # fmt: skip


@pytest.mark.parametrize(("name", "choices"), CHOICES)
def test_the_engine_takes_exactly_the_generated_choices(name, choices):
    extra = {"max_steps": 1} if name == "training_mode" else {}
    extra |= {"osft": True, "osft_unfreeze_rank_ratio": 0.5} if name.startswith("osft_") else {}
    extra |= {"validation_data_path": "v.jsonl"} if name in VALIDATION_FIELDS else {}
    for choice in choices:
        osft = {"osft_unfreeze_rank_ratio": 0.5} if (name, choice) == ("method", "osft") else {}
        TrainingArgs(**REQUIRED, **extra, **osft, **{name: choice, "max_tokens": 1})
    with pytest.raises(UserError, match=f"--{name.replace('_', '-')}: unknown value"):
        TrainingArgs(**REQUIRED, **extra, **{name: "nonsense"})


def test_schema_refuses_what_a_pipeline_job_cannot_run():
    with pytest.raises(Exception, match="infinite"):
        small(training_mode="infinite")
    with pytest.raises(Exception, match="nope"):
        small(nope=1)


def test_check_command_names_the_line_of_a_configfile(tmp_path, capsys):
    """For files given with --configfile, which Snakemake reads before the workflow loads."""
    from mini_trainer.pipeline.checks import main

    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("model: demo\n")
    bad.write_text("model: demo\nstages:\n  - sort\n - sort_desc\n")
    assert main([str(good)]) == 0 and capsys.readouterr().err == ""
    assert main([str(good), str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"{bad}:4: YAML syntax error: ")
    command = subprocess.run(
        [sys.executable, "-m", "mini_trainer.pipeline", str(bad)],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, env=subprocess_env(),
    )  # fmt: skip
    assert command.returncode == 2
    want = f"{bad}:4: YAML syntax error: expected <block end>, but found '<block sequence start>'"
    assert command.stderr.splitlines() == [f"{want} (column 2)"]


# ---------------------------------------------------------------------------------------------
# Validation during training: a split or a task's own file, best/ evaluated on request.


def test_validation_fraction_splits_trains_on_the_rest_and_evaluates_best():
    config = small(validation_every_steps=8)
    config["data"]["validation_fraction"] = 0.1
    config["evaluation"]["checkpoint"] = "best"
    pipeline.check_config(config)
    for stage, task in ((1, "sort"), (2, "sort_desc")):
        options = pipeline.training_options(config, "sft", "0.01", stage)
        assert options["data_path"] == f"results/data/{task}.split.train.jsonl"
        assert options["validation_data_path"] == f"results/data/{task}.split.validation.jsonl"
        assert options["save_best"] is True and options["validation_every_steps"] == 8
        flags = shlex.split(pipeline.cli_flags(options))
        assert "--save-best" in flags and flags[flags.index("--validation-every-steps") + 1] == "8"
        key = pipeline.run_key(config, "sft", "0.01", stage)
        inputs = pipeline.train_inputs(config, "sft", "0.01", stage, key)
        assert inputs["data"] == options["data_path"]
        assert inputs["validation"] == options["validation_data_path"]
        best = pipeline.eval_checkpoint(config, f"sft/lr0.01/stage{stage}")
        assert best == pipeline.run_dir(config, "sft", "0.01", stage) + "/best"
    # The next stage starts from final/, whatever is evaluated.
    assert pipeline.start_model(config, "sft", "0.01", 2).endswith("/final")
    assert pipeline.eval_checkpoint(config, "base") == "resources/demo/model"
    config["evaluation"]["checkpoint"] = "final"
    assert pipeline.eval_checkpoint(config, "sft/lr0.01/stage1") == pipeline.final_dir(
        config, "sft", "0.01", 1
    )


def test_a_task_validation_file_wins_and_none_changes_nothing(demo):
    config = small()
    keys = [pipeline.run_key(config, "sft", "0.01", s) for s in (1, 2)]
    assert pipeline.validation_file(config, "sort") is None
    assert "validation" not in pipeline.train_inputs(config, "sft", "0.01", 1, keys[0])
    assert "validation_data_path" not in pipeline.training_options(config, "sft", "0.01", 1)
    config["tasks"] = {"sort": {"train": "t.jsonl", "eval": "e.jsonl", "validation": "v.jsonl"}}
    config["data"]["validation_fraction"] = 0.1
    options = pipeline.training_options(config, "sft", "0.01", 1)
    assert options["validation_data_path"] == "v.jsonl" and options["data_path"] == "t.jsonl"
    assert pipeline.train_file(config, "sort_desc") == "results/data/sort_desc.split.train.jsonl"
    # Run keys without validation are those of before (existing run folders keep resuming).
    assert pipeline.run_dir(demo, "sft", "0.003", 1).endswith("/4a6f81bd52")


@pytest.mark.parametrize(
    ("where", "key", "message"),
    [("training", "early_stopping_patience",
      "config: training.early_stopping_patience (method sft)"),
     ("method", "best_metric", "config: methods.sft.training.best_metric"),
     ("evaluation", "checkpoint", "config: evaluation.checkpoint: best")],
)  # fmt: skip
def test_validation_keys_without_a_validation_file_fail_at_once(where, key, message):
    config = small()
    value = {"early_stopping_patience": 2, "best_metric": "val_exact_match"}.get(key, "best")
    {"training": config["training"], "evaluation": config["evaluation"],
     "method": config["methods"]["sft"].setdefault("training", {})}[where][key] = value  # fmt: skip
    config["tasks"] = {"sort": {"train": "t.jsonl", "eval": "e.jsonl", "validation": "v.jsonl"}}
    with pytest.raises(pipeline.ConfigError) as caught:
        pipeline.check_config(config)
    assert str(caught.value).startswith(message)
    assert "no validation file for sort_desc (set data.validation_fraction" in str(caught.value)
    config["data"]["validation_fraction"] = 0.2
    pipeline.check_config(config)


def test_one_evaluate_job_per_source_scores_every_stage_task(demo):
    files = pipeline.eval_data_files(demo)
    outs = pipeline.eval_outputs(demo)
    assert outs == [f"results/eval/{{source}}/{task}.json" for task in demo["stages"]]
    assert files == [pipeline.task_file(demo, task, "eval") for task in demo["stages"]]
    assert pipeline.eval_outputs(demo, "base")[0] == pipeline.eval_json("base", demo["stages"][0])
    flags = pipeline.eval_pairs(files[:2], ["a b.json", "c.json"])
    assert flags == f"--data {files[0]} --out 'a b.json' --data {files[1]} --out c.json"
    # Every JSON the report needs is some evaluate job's output.
    produced = {o.replace("{source}", s) for s in pipeline.eval_sources(demo) for o in outs}
    assert set(pipeline.all_eval_jsons(demo)) <= produced
    with pytest.raises(ValueError):
        pipeline.eval_pairs(files, outs[:1])


def test_empty_model_revision_is_refused_naming_the_file_that_sets_it(tmp_path):
    own, first, second = (tmp_path / f"{n}.yaml" for n in ("config", "a", "b"))
    own.write_text("model: org/name\nmodel_revision: ''\n")
    first.write_text("model_revision: '  '\n")
    second.write_text("seed: 1\n")  # a later --configfile that does not set it
    # Snakemake's lists: every --configfile, then the Snakefile's own; the --configfile ones.
    files, cli = [str(first), str(second), str(own)], [str(first), str(second)]
    reason = "name a branch, tag or commit, or leave the key out for main"
    for value, command_line, where, shown in (
        ("  ", {}, first, " ('  ')"),  # the last --configfile that sets it wins
        (None, {"model_revision": None}, "config", ""),  # --config model_revision=
    ):
        with pytest.raises(pipeline.ConfigError) as caught:
            pipeline.check_before_schema(
                {"model": "org/name", "model_revision": value}, command_line, files, cli
            )
        assert str(caught.value) == f"{where}: model_revision: empty{shown}; {reason}"
    with pytest.raises(pipeline.ConfigError, match=rf"^{own}: model_revision: empty \(''\)"):
        pipeline.check_before_schema({"model_revision": ""}, {}, [str(own)], [])
    for fine in ({}, {"model_revision": "main"}, {"model_revision": 3}):  # 3: the schema's
        pipeline.check_before_schema(fine, {}, files, cli)
