# WiSE-FT weight interpolation: for a method with interpolation_alphas, every run's
# (1 - a) * start + a * final, written once per alpha (no training) and evaluated like any
# checkpoint, as the series <method>-wise<percent> (mini_trainer/pipeline/interpolation.py).


rule interpolate:
    """Blend of a run's starting weights and its final weights at one alpha."""
    input:
        unpack(lambda wc: interpolation_inputs(wc.source, wc.pct)),
    output:
        directory("results/interpolate/{source}/wise{pct}"),
    wildcard_constraints:
        source=r"[A-Za-z0-9][A-Za-z0-9_-]*/lr[0-9][0-9.e+-]*/stage[1-9][0-9]*/[0-9a-f]+",
        pct=r"[1-9][0-9]?",
    params:
        alpha=lambda wc: int(wc.pct) / 100,
    log:
        "logs/interpolate/{source}/wise{pct}.log",
    benchmark:
        "results/benchmarks/interpolate/{source}/wise{pct}.tsv"
    threads: rule_threads("interpolate", 1)
    resources:
        mem_mb=rule_resource("interpolate", "mem_mb"),
        runtime=rule_resource("interpolate", "runtime"),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        '"$MINI_TRAINER_PYTHON" -m mini_trainer interpolate --previous {input.previous:q}'
        " --new {input.new:q} --alpha {params.alpha} --out {output:q} > {log} 2>&1"
