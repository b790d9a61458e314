# Data: the embedded demo (model: demo), chat tasks tokenized, stage mixtures and replay, and
# the checks of every training file.


rule demo_assets:
    """The offline demo: a tiny random-init Llama, its tokenizer and the synthetic tasks."""
    output:
        model=directory(f"{DEMO_DIR}/model"),
        data=expand(
            f"{DEMO_DIR}/data/{{task}}.{{split}}.jsonl", task=DEMO_TASKS, split=["train", "eval"]
        ),
    params:
        out=lambda wc, output: os.path.dirname(output.model),
        seed=config["demo_seed"],
    log:
        "logs/demo_assets.log",
    benchmark:
        "results/benchmarks/demo_assets.tsv"
    threads: 1
    resources:
        mem_mb=rule_resource("demo_assets", "mem_mb"),
        runtime=rule_resource("demo_assets", "runtime"),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        # --force: Snakemake has already removed this rule's outputs; replace any leftovers.
        '"$MINI_TRAINER_PYTHON" -m mini_trainer demo-assets'
        " --out {params.out} --seed {params.seed} --force > {log} 2>&1"


rule tokenize:
    """A `format: chat` task's chat JSONL, tokenized with the model's chat template.

    No length cap here: validate applies `data.on_long` to the result, so its summary (and the
    report) counts what was dropped, and line N of the output is line N of the chat file.
    """
    input:
        chat=lambda wc: chat_file(wc.task, wc.split),
        model=base_model(),
        tokenizer=tokenizer_files(),
    output:
        "results/data/tokenized/{task}.{split}.jsonl",
    wildcard_constraints:
        split="train|eval",
    log:
        "logs/tokenize/{task}.{split}.log",
    benchmark:
        "results/benchmarks/tokenize/{task}.{split}.tsv"
    threads: 1
    resources:
        mem_mb=rule_resource("tokenize", "mem_mb"),
        runtime=rule_resource("tokenize", "runtime"),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        '"$MINI_TRAINER_PYTHON" -m mini_trainer tokenize {input.chat:q} --model {input.model:q}'
        " --out {output:q} --force > {log} 2>&1"


rule mix:
    """A stage's training mixture (`mixtures:`) and/or a replay method's share of the earlier
    stages' samples, as one file (see docs/data.md for how samples are chosen)."""
    input:
        mix_input_files,
    output:
        data="results/data/mix/{name}.jsonl",
        sidecar="results/data/mix/{name}.mix.json",
    wildcard_constraints:
        name=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    params:
        flags=mix_flags,
        seed=config["data"]["seed"],
    log:
        "logs/mix/{name}.log",
    benchmark:
        "results/benchmarks/mix/{name}.tsv"
    threads: 1
    resources:
        mem_mb=rule_resource("mix", "mem_mb"),
        runtime=rule_resource("mix", "runtime"),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        '"$MINI_TRAINER_PYTHON" -m mini_trainer mix {params.flags} --seed {params.seed}'
        " --out {output.data:q} --out-sidecar {output.sidecar:q} --force > {log} 2>&1"


rule validate:
    """Check every line of a training file (a task's or a mixture's) and write the lengths
    index training reads."""
    input:
        data=lambda wc: train_file(wc.task),
        model=base_model(),
    output:
        index=data_index("{task}"),
        summary=report(
            data_summary("{task}"),
            caption="../report/data_summary.rst",
            category="Data",
            labels={"task": "{task}"},
        ),
    wildcard_constraints:
        task=r"(mix/)?[A-Za-z0-9][A-Za-z0-9_.-]*",
    params:
        max_tokens_per_gpu=config["training"]["max_tokens_per_gpu"],
        on_long=config["data"]["on_long"],
    log:
        "logs/validate/{task}.log",
    benchmark:
        "results/benchmarks/validate/{task}.tsv"
    threads: rule_threads("validate", 1)
    resources:
        mem_mb=rule_resource("validate", "mem_mb"),
        runtime=rule_resource("validate", "runtime"),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        '"$MINI_TRAINER_PYTHON" -m mini_trainer validate {input.data:q} --model {input.model:q}'
        " --max-tokens-per-gpu {params.max_tokens_per_gpu} --on-long {params.on_long}"
        " --workers {threads} --out-index {output.index:q} --out-summary {output.summary:q}"
        " > {log} 2>&1"
