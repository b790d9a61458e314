"""What a pipeline config puts on disk, counted from its DAG: the runs, the SVD caches, the
evaluations (pure functions of the config, like `layout`); `plan --config` multiplies them by
one run's disk figures (`plan/experiment.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from mini_trainer.pipeline.layout import (
    Config,
    all_eval_jsons,
    method_options,
    run_dir,
    svd_dir,
    sweep,
    validation_file,
)


@dataclass(frozen=True)
class MethodRuns:
    """One method's share of the experiment."""

    runs: int
    """Run folders it trains (a run shared with an earlier method, same run key, counts there)."""
    chains: int
    """Its learning rates with a run of their own: training jobs of the method that can run at
    once (each rate's stages run one after another)."""
    svd_caches: int
    """SVD folders its runs start from (OSFT), counting a folder shared with an earlier method
    once."""


@dataclass(frozen=True)
class Experiment:
    """The experiment a config describes, for its disk plan."""

    methods: dict[str, MethodRuns]
    """Per method, in config order."""
    keep_states_after_final: bool
    """Finished runs keep their states (config `keep_states_after_final`)."""
    best: bool
    """Every run also writes best/ (a validation file for every stage)."""
    evaluations: int
    """Evaluation JSON files (each a few hundred bytes)."""


def experiment(config: Config) -> Experiment:
    """Count the config's runs, SVD folders and evaluations, each shared one once."""
    seen_runs: set[str] = set()
    seen_svd: set[str] = set()
    counts: dict[str, dict[str, set]] = {m: {"runs": set(), "lrs": set(), "svd": set()}
                                         for m in config["methods"]}  # fmt: skip
    for method, lr, stage in sweep(config):
        folder = run_dir(config, method, lr, stage)
        if folder in seen_runs:
            continue
        seen_runs.add(folder)
        counts[method]["runs"].add(folder)
        counts[method]["lrs"].add(lr)
        if method_options(config, method).get("osft"):
            cache = svd_dir(config, method, lr, stage)
            if cache not in seen_svd:
                seen_svd.add(cache)
                counts[method]["svd"].add(cache)
    return Experiment(
        methods={
            m: MethodRuns(len(c["runs"]), len(c["lrs"]), len(c["svd"])) for m, c in counts.items()
        },
        keep_states_after_final=bool(config.get("keep_states_after_final", False)),
        best=all(validation_file(config, task) for task in config["stages"]),
        evaluations=len(all_eval_jsons(config)),
    )
