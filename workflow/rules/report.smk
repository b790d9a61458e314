# Report: the manifest (which file is which cell of the accuracy matrix), then the HTML report.


rule manifest:
    """results/manifest.json: every eval JSON, run folder and data summary, with its cell."""
    input:
        **manifest_inputs(),
    output:
        "results/manifest.json",
    params:
        entries=manifest_flags(),
    log:
        "logs/manifest.log",
    benchmark:
        "results/benchmarks/manifest.tsv"
    threads: 1
    resources:
        mem_mb=rule_resource("report", "mem_mb"),
        runtime=rule_resource("report", "runtime"),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        '"$MINI_TRAINER_PYTHON" -m mini_trainer manifest --out {output:q}'
        " {params.entries} > {log} 2>&1"


rule report:
    """results/report/: report.html with the accuracy matrices, frontiers and loss curves."""
    input:
        manifest="results/manifest.json",
        **manifest_inputs(),
    output:
        report(
            directory("results/report"),
            htmlindex="report.html",
            caption="../report/report.rst",
            category="Report",
        ),
    log:
        "logs/report.log",
    benchmark:
        "results/benchmarks/report.tsv"
    threads: rule_threads("report", 1)
    resources:
        mem_mb=rule_resource("report", "mem_mb"),
        runtime=rule_resource("report", "runtime"),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        '"$MINI_TRAINER_PYTHON" -m mini_trainer report --out {output:q}'
        " --manifest {input.manifest:q} > {log} 2>&1"
