# EWC: the diagonal Fisher of each stage's data at that stage's final weights, taken once.
#
# The folder mirrors the run folder it is taken from (results/ewc_fisher/{method}/lr{lr}/
# stage{i}/{key}), so the next stage of the same EWC method and learning rate asks for it, and a
# change upstream (a new run key) takes a new one. Stage i >= 2 adds gamma times the Fisher of
# stage i - 1 (online EWC; mini_trainer/ewc/fisher.py states the estimator).


rule ewc_fisher:
    """Diagonal Fisher and anchor weights of a stage's final weights (one process)."""
    input:
        unpack(lambda wc: ewc_fisher_inputs(wc.source)),
    output:
        directory("results/ewc_fisher/{source}"),
    wildcard_constraints:
        source=r"[A-Za-z0-9][A-Za-z0-9_-]*/lr[0-9][0-9.e+-]*/stage[1-9][0-9]*/[0-9a-f]+",
    params:
        previous=lambda wc, input: f"--previous {input.previous}" if "previous" in input.keys() else "",
        settings=lambda wc: cli_flags(ewc_fisher_settings(wc.source)),
    log:
        "logs/ewc_fisher/{source}.log",
    benchmark:
        "results/benchmarks/ewc_fisher/{source}.tsv"
    threads: rule_threads("ewc_fisher", 1)
    resources:
        mem_mb=rule_resource("ewc_fisher", "mem_mb"),
        runtime=rule_resource("ewc_fisher", "runtime"),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        '"$MINI_TRAINER_PYTHON" -m mini_trainer ewc-fisher --model {input.model:q}'
        " --data {input.data:q} {params.previous} {params.settings}"
        " --out {output:q} > {log} 2>&1"
