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


rule resolve_model:
    """A Hub model (model: ORG/NAME) fetched into the Hugging Face cache and its record.

    A local rule: it runs on the submitting host, since cluster nodes often have no internet;
    the cache (HF_HOME) must be shared with them. Every job that reads the base model takes
    the record as input, so a new commit reruns them and the same commit nothing.
    """
    output:
        MODEL_RECORD,
    params:
        model=lambda wc: hub_model()[0],
        commit=lambda wc: hub_model()[1],
    log:
        "logs/resolve_model.log",
    benchmark:
        "results/benchmarks/resolve_model.tsv"
    threads: 1
    resources:
        mem_mb=rule_resource("resolve_model", "mem_mb"),
        runtime=rule_resource("resolve_model", "runtime"),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        '"$MINI_TRAINER_PYTHON" -m mini_trainer resolve-model --model {params.model:q}'
        " --model-revision {params.commit} --out {output:q} > {log} 2>&1"


rule tokenize:
    """A `format: chat` task's chat JSONL, tokenized with the model's chat template.

    No length cap here: validate applies `data.on_long` to the result, so its summary (and the
    report) counts what was dropped, and line N of the output is line N of the chat file.
    """
    input:
        chat=lambda wc: chat_file(wc.task, wc.split),
        model=model_input(base_model()),
        tokenizer=tokenizer_files(),
    output:
        "results/data/tokenized/{task}.{split}.jsonl",
    wildcard_constraints:
        split="train|eval",
    params:
        model=model_flags(base_model()),
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
        '"$MINI_TRAINER_PYTHON" -m mini_trainer tokenize {input.chat:q} {params.model}'
        " --out {output:q} --force > {log} 2>&1"


if "trace" in config:

    rule trace_chat:
        """A TRACE task's file (`trace.root`/<task>/{train,test}.json) as chat JSONL, the prompt
        the user turn and the answer the reply (`mini-trainer trace-chat`; config/trace.yaml)."""
        input:
            lambda wc: trace_source(wc.task, wc.split),
        output:
            "results/data/trace/{task}.{split}.jsonl",
        wildcard_constraints:
            split="train|eval",
        params:
            sha256=lambda wc: trace_chat_flags(wc.task, wc.split),
        log:
            "logs/trace_chat/{task}.{split}.log",
        benchmark:
            "results/benchmarks/trace_chat/{task}.{split}.tsv"
        threads: 1
        resources:
            mem_mb=rule_resource("trace_chat", "mem_mb"),
            runtime=rule_resource("trace_chat", "runtime"),
        conda:
            "../envs/mini-trainer.yaml"
        shell:
            '"$MINI_TRAINER_PYTHON" -m mini_trainer trace-chat {input:q} --out {output:q}'
            "{params.sha256} --force > {log} 2>&1"


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
        model=model_input(base_model()),
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
        model=model_flags(base_model()),
        max_tokens_per_gpu=pipeline.data_token_cap(config),
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
        '"$MINI_TRAINER_PYTHON" -m mini_trainer validate {input.data:q} {params.model}'
        " --max-tokens-per-gpu {params.max_tokens_per_gpu} --on-long {params.on_long}"
        " --workers {threads} --out-index {output.index:q} --out-summary {output.summary:q}"
        " > {log} 2>&1"


rule split_validation:
    """Split data.validation_fraction of a task's training file off as its validation file."""
    input:
        data=lambda wc: task_file(wc.task, "train"),
        eval=lambda wc: task_file(wc.task, "eval"),
    output:
        train="results/data/{task}.split.train.jsonl",
        validation="results/data/{task}.split.validation.jsonl",
    params:
        fraction=config["data"].get("validation_fraction"),
        seed=config["training"].get("seed", 42),
    log:
        "logs/split_validation/{task}.log",
    benchmark:
        "results/benchmarks/split_validation/{task}.tsv"
    threads: 1
    resources:
        mem_mb=rule_resource("validate", "mem_mb"),
        runtime=rule_resource("validate", "runtime"),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        # The validation file is checked by the training job (as the training data); the
        # training part by the validate rule.
        '"$MINI_TRAINER_PYTHON" -m mini_trainer split-validation {input.data:q}'
        " --fraction {params.fraction} --seed {params.seed} --exclude {input.eval:q}"
        " --out-train {output.train:q} --out-validation {output.validation:q} --force"
        " > {log} 2>&1"
