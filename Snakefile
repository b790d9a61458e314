# mini-trainer: the whole experiment as one DAG.
#
#   demo_assets -> validate -> osft_svd -> train -> evaluate -> manifest -> report
#
# `snakemake --cores N` runs config/config.yaml (the CPU demo); see config/README.md for every
# key and `--configfile F --replace-workflow-config` to run another config on its own.

from snakemake.utils import min_version, validate

from mini_trainer.pipeline import check_before_schema, check_yaml_syntax, exit_on_config_error

min_version("9.0")


# Snakemake's own YAML error names neither the file nor the line: read the file first.
with exit_on_config_error():
    check_yaml_syntax("config/config.yaml")


configfile: "config/config.yaml"


# An empty model_revision: one line naming the file and key (the schema's message is several).
with exit_on_config_error():
    check_before_schema(
        config, workflow.config_settings.config, workflow.configfiles, workflow.overwrite_configfiles
    )


validate(config, "workflow/schemas/config.schema.yaml")


wildcard_constraints:
    task=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    method=r"[A-Za-z0-9][A-Za-z0-9_-]*",
    lr=r"[0-9][0-9.e+-]*",
    stage=r"[1-9][0-9]*",
    key=r"[0-9a-f]+",


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/osft.smk"
include: "workflow/rules/ewc.smk"
include: "workflow/rules/interpolate.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


# Cheap bookkeeping runs on the submitting host, not as a cluster job.
localrules:
    all,
    resolve_model,
    trainings,
    evaluations,
    manifest,


rule all:
    """Everything: results/report/report.html."""
    input:
        "results/report",
    default_target: True


rule trainings:
    """Target: every final checkpoint (snakemake --cores N trainings)."""
    input:
        [final_dir(m, lr, s) for m, lr, s in sweep()],


rule evaluations:
    """Target: every evaluation JSON."""
    input:
        all_eval_jsons(),
