# Evaluation: every checkpoint (the base model and every method, learning rate and stage) on
# every task's eval set, so the report can draw the accuracy matrix. Only the evaluation
# settings are this rule's params: changing them reruns evaluation and the report, nothing else.


rule evaluate:
    """Held-out loss, perplexity and teacher-forced answer-token accuracy of one checkpoint."""
    input:
        model=lambda wc: model_input(eval_model(wc.source)),
        data=lambda wc: task_file(wc.task, "eval"),
    output:
        "results/eval/{source}/{task}.json",
    wildcard_constraints:
        source=r"base|[A-Za-z0-9][A-Za-z0-9_-]*/lr[0-9][0-9.e+-]*/stage[1-9][0-9]*",
    params:
        model=lambda wc: model_flags(eval_checkpoint(wc.source)),
        options=cli_flags(
            {
                "max_tokens_per_gpu": config["evaluation"]["max_tokens_per_gpu"],
                "lm_eval_tasks": ",".join(config["evaluation"]["lm_eval_tasks"]) or None,
            }
        ),
    log:
        "logs/evaluate/{source}/{task}.log",
    benchmark:
        "results/benchmarks/evaluate/{source}/{task}.tsv"
    threads: rule_threads("evaluate", 1)
    resources:
        mem_mb=rule_resource("evaluate", "mem_mb"),
        runtime=rule_resource("evaluate", "runtime"),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        '"$MINI_TRAINER_PYTHON" -m mini_trainer evaluate {params.model}'
        " --data {input.data:q} --out {output:q} {params.options} > {log} 2>&1"
