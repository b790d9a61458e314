# OSFT: the SVD of each stage's starting weights, computed once and shared.
#
# The folder is named after the weights it factorizes (`svd_dir` in common.smk): "base" for the
# base model, or the run folder of the checkpoint a stage starts from, plus the target patterns.
# Every job that starts from the same weights with the same targets therefore asks for the same
# folder and Snakemake computes it once: stage 1 of every OSFT method and learning rate shares
# the base model's SVD. The folder is redone only when those weights are (their run key is in
# the name, and Snakemake reruns it when the checkpoint is newer).


rule osft_svd:
    """SVD factors (fp32) of every targeted weight of a checkpoint."""
    input:
        model=lambda wc: model_input(svd_model(wc.source)),
    output:
        directory("results/osft_svd/{source}/{targets}"),
    wildcard_constraints:
        source=r"base|[A-Za-z0-9][A-Za-z0-9_-]*/lr[0-9][0-9.e+-]*/stage[1-9][0-9]*/[0-9a-f]+",
        targets=r"default-targets|targets-[0-9a-f]+",
    params:
        model=lambda wc: model_flags(svd_model(wc.source)),
        # osft-svd takes the patterns comma-separated (train takes them space-separated).
        patterns=lambda wc: cli_flags(
            {"target_patterns": ",".join(svd_target_patterns(wc.targets)) or None}
        ),
    log:
        "logs/osft_svd/{source}/{targets}.log",
    benchmark:
        "results/benchmarks/osft_svd/{source}/{targets}.tsv"
    threads: rule_threads("osft_svd", 1)
    resources:
        mem_mb=rule_resource("osft_svd", "mem_mb"),
        runtime=rule_resource("osft_svd", "runtime"),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        '"$MINI_TRAINER_PYTHON" -m mini_trainer osft-svd {params.model}'
        " --out {output:q} {params.patterns} > {log} 2>&1"
