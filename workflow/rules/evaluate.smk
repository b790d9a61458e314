# Evaluation: every checkpoint (the base model and every method, learning rate and stage) on
# every task's eval set, so the report can draw the accuracy matrix. One job per checkpoint
# scores all the eval sets with one model load (a process start and a load per file were most
# of a small model's evaluation); it writes one JSON per task. Only the evaluation settings are
# this rule's params: changing them reruns evaluation and the report, nothing else.


rule evaluate:
    """Held-out loss, perplexity and teacher-forced answer-token accuracy of one checkpoint on
    every task's eval set."""
    input:
        model=lambda wc: model_input(eval_model(wc.source)),
        data=eval_data_files(),
    output:
        eval_outputs(),
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
        pairs=lambda wc, input, output: eval_pairs(input.data, output),
    log:
        "logs/evaluate/{source}.log",
    benchmark:
        "results/benchmarks/evaluate/{source}.tsv"
    threads: rule_threads("evaluate", 1)
    resources:
        mem_mb=rule_resource("evaluate", "mem_mb"),
        runtime=rule_resource("evaluate", "runtime"),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        '"$MINI_TRAINER_PYTHON" -m mini_trainer evaluate {params.model}'
        " {params.pairs} {params.options} > {log} 2>&1"


if "trace" in config:

    rule trace_generate:
        """A checkpoint's greedy answers to a TRACE task's eval prompts (config/trace.yaml)."""
        input:
            model=lambda wc: model_input(eval_model(wc.source)),
            chat="results/data/trace/{task}.eval.jsonl",
        output:
            trace_predictions("{source}", "{task}"),
        wildcard_constraints:
            source=r"base|[A-Za-z0-9][A-Za-z0-9_-]*/lr[0-9][0-9.e+-]*/stage[1-9][0-9]*",
        params:
            model=lambda wc: model_flags(eval_checkpoint(wc.source)),
            max_new=config["trace"]["max_new_tokens"],
        log:
            "logs/trace_generate/{source}/{task}.log",
        benchmark:
            "results/benchmarks/trace_generate/{source}/{task}.tsv"
        threads: rule_threads("trace_generate", 1)
        resources:
            mem_mb=rule_resource("trace_generate", "mem_mb"),
            runtime=rule_resource("trace_generate", "runtime"),
        conda:
            "../envs/mini-trainer.yaml"
        shell:
            '"$MINI_TRAINER_PYTHON" -m mini_trainer generate {params.model} --data {input.chat:q}'
            " --out {output:q} --max-new-tokens {params.max_new} --force > {log} 2>&1"

    rule trace_score:
        """TRACE's metric of a task on a checkpoint's answers (`mini-trainer trace-score`)."""
        input:
            predictions=trace_predictions("{source}", "{task}"),
            data=lambda wc: trace_source(wc.task, "eval"),
        output:
            trace_score_file("{source}", "{task}"),
        wildcard_constraints:
            source=r"base|[A-Za-z0-9][A-Za-z0-9_-]*/lr[0-9][0-9.e+-]*/stage[1-9][0-9]*",
        log:
            "logs/trace_score/{source}/{task}.log",
        threads: 1
        resources:
            mem_mb=rule_resource("trace_chat", "mem_mb"),
            runtime=rule_resource("trace_chat", "runtime"),
        conda:
            "../envs/mini-trainer.yaml"
        shell:
            '"$MINI_TRAINER_PYTHON" -m mini_trainer trace-score --task {wildcards.task:q}'
            " --data {input.data:q} --predictions {input.predictions:q} --out {output:q}"
            " --force > {log} 2>&1"
