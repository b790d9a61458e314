# Shared by all rules: the pipeline's logic bound to this run's `config`. The logic itself (paths,
# run keys, merged options, flags, checks) is in mini_trainer/pipeline/, as pure functions of the
# config with unit tests (tests/test_pipeline_logic.py); this file only binds them, so rules call
# `final_dir(m, lr, s)` for `pipeline.final_dir(config, m, lr, s)`. Rules never spell a path
# themselves. Layout: mini_trainer/pipeline/layout.py (config/README.md describes it for users).

import functools
import shlex
import sys

import mini_trainer.pipeline as pipeline

try:
    from snakemake_interface_executor_plugins.settings import DeploymentMethod
except ImportError:  # pragma: no cover - older interface package
    DeploymentMethod = None

DEMO_DIR = pipeline.DEMO_DIR
DEMO_TASKS = pipeline.DEMO_TASKS
BASE = pipeline.BASE


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


def _bind(function):
    """`function(config, ...)` as `f(...)`, cached: rules ask for the same paths many times."""
    return functools.cache(functools.partial(function, config))


# Names and paths (mini_trainer/pipeline/layout.py).
lr_value = _bind(pipeline.lr_value)
sweep = _bind(pipeline.sweep)
base_model = _bind(pipeline.base_model)
task_file = _bind(pipeline.task_file)
validation_file = _bind(pipeline.validation_file)
chat_file = _bind(pipeline.chat_file)
trace_source = _bind(pipeline.trace_source)
trace_chat_flags = _bind(pipeline.trace_chat_flags)
trace_predictions = pipeline.trace_predictions
trace_score_file = pipeline.trace_score_file
tokenizer_files = _bind(pipeline.tokenizer_files)
stage_dataset = _bind(pipeline.stage_dataset)
train_file = _bind(pipeline.train_file)
method_options = _bind(pipeline.method_options)
svd_dir = _bind(pipeline.svd_dir)
svd_model = _bind(pipeline.svd_model)
svd_target_patterns = _bind(pipeline.svd_target_patterns)
ewc_fisher_inputs = _bind(pipeline.ewc_fisher_inputs)
interpolation_inputs = _bind(pipeline.interpolation_inputs)
ewc_fisher_settings = _bind(pipeline.ewc_fisher_settings)
start_model = _bind(pipeline.start_model)
training_options = _bind(pipeline.training_options)
run_key = _bind(pipeline.run_key)
run_dir = _bind(pipeline.run_dir)
final_dir = _bind(pipeline.final_dir)
eval_sources = _bind(pipeline.eval_sources)
eval_model = _bind(pipeline.eval_model)
MODEL_RECORD = pipeline.MODEL_RECORD
hub_model = _bind(pipeline.hub_model)
model_input = _bind(pipeline.model_input)
model_flags = _bind(pipeline.model_flags)
eval_checkpoint = _bind(pipeline.eval_checkpoint)
all_eval_jsons = _bind(pipeline.all_eval_jsons)
eval_data_files = _bind(pipeline.eval_data_files)
eval_outputs = _bind(pipeline.eval_outputs)
eval_pairs = pipeline.eval_pairs
lr_str = pipeline.lr_str
data_index = pipeline.data_index
data_summary = pipeline.data_summary
eval_json = pipeline.eval_json
parse_source = pipeline.parse_source

# Command lines and resources (mini_trainer/pipeline/commands.py).
cli_flags = pipeline.cli_flags
torchrun_launcher = _bind(pipeline.torchrun_launcher)
train_node_resources = _bind(pipeline.train_node_resources)
drop_states_resource = _bind(pipeline.drop_states_resource)
train_threads = _bind(pipeline.train_threads)
rule_threads = _bind(pipeline.rule_threads)
rule_resource = _bind(pipeline.rule_resource)
manifest_inputs = _bind(pipeline.manifest_inputs)
manifest_flags = _bind(pipeline.manifest_flags)


# Flags of the plan rule: mini_trainer/pipeline/commands.py (its files come from planning.py).
plan_flags = _bind(pipeline.plan_flags)


def train_inputs(wc):
    inputs = pipeline.train_inputs(config, wc.method, wc.lr, int(wc.stage), wc.key)
    if "plan" in inputs:  # a replanned table (e.g. after a software update) retrains nothing
        inputs["plan"] = ancient(inputs["plan"])
    return inputs


def mix_flags(wc):
    return pipeline.mix_flags(config, wc.name)


def mix_input_files(wc):
    return pipeline.mix_input_files(config, wc.name)


# Config checks beyond the schema (mini_trainer/pipeline/checks.py), before any job: one line
# (`config: KEY: reason`), exit status 2.
with pipeline.exit_on_config_error():
    hub_model()  # a Hub id's commit, looked up once here (mini_trainer/pipeline/hub.py)
    pipeline.check_config(config)
