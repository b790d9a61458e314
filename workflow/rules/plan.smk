# Planning: before any GPU training job, `mini-trainer plan --require-fit` checks that each
# method's options fit the GPUs of `launch:` (gpus_per_node, gpu_memory_gib), from the base
# model's config.json alone (docs/plan.md). A config that does not fit fails here, in seconds,
# with the plan's table in the log, instead of out of memory after the queue wait and the model
# load. One job per method (every lr and stage has the same options and architecture); the
# train rule takes its table as input only when gpus_per_node > 0, so CPU configs have no plan
# job. Flags: mini_trainer/pipeline/commands.py; paths: mini_trainer/pipeline/planning.py.


rule plan:
    """Check that the method fits the configured GPUs (exit 4 when it does not)."""
    input:
        model=model_input(base_model()),
    output:
        "results/plan/{method}.txt",
    params:
        flags=lambda wc: plan_flags(wc.method),
    log:
        # The table, then the one-line error when it does not fit.
        "logs/plan/{method}.log",
    benchmark:
        "results/benchmarks/plan/{method}.tsv"
    localrule: True
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        # Table on stdout into the output and the log; stderr (the error line) into the log.
        ": > {log}; "
        '"$MINI_TRAINER_PYTHON" -m mini_trainer plan {params.flags} 2>> {log}'
        " | tee -a {log} > {output}"
