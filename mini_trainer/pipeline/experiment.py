"""What a pipeline config puts on disk, counted from its DAG: the runs, their steps and
`hf_format/` exports, the SVD caches, the evaluations, the data files under results/data and the
jobs (each with a log); `plan --config` multiplies them by one run's disk figures
(`plan/experiment.py`). Functions of the config, like `layout`, and of the training files'
sizes (`data_sizes`, given)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mini_trainer.pipeline import data
from mini_trainer.pipeline.data_sizes import Size
from mini_trainer.pipeline.layout import (
    Config,
    all_eval_jsons,
    eval_sources,
    evaluated_source,
    method_options,
    mix_inputs,
    run_dir,
    stage_dataset,
    svd_dir,
    sweep,
    task_file,
    train_file,
    training_options,
    validation_file,
)
from mini_trainer.training.checkpoint_policy import checkpoints_due
from mini_trainer.training.stopping import planned_steps
from mini_trainer.training_args import TrainingArgs


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
    steps: int | None = 0
    """Optimizer steps of its runs together (metrics.jsonl rows); None: not known (a training
    file not yet written and not estimated, or token mode)."""
    exports: int | None = 0
    """`hf_format/samples_<N>/` exports of its runs together (`checkpoint_at_epoch`,
    `min_samples_per_checkpoint`); None: not known, as `steps`."""


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
    data_files: tuple[str, ...] = ()
    """The files the data rules write under results/data (tokenized, split, mixed)."""
    jobs: int = 0
    """Jobs that write a log under logs/: training runs, SVD caches, evaluations (one job per
    evaluated checkpoint), data files (one job each) and the validation of each training file."""


def experiment(config: Config, size: Callable[[str], Size | None] = lambda _: None) -> Experiment:
    """Count the config's runs, SVD folders and evaluations, each shared one once; `size`: a
    training file's size (`data_sizes.size_of`), for the runs' steps and exports."""
    seen_runs: set[str] = set()
    seen_svd: set[str] = set()
    counts: dict[str, dict] = {m: {"runs": set(), "lrs": set(), "svd": set(), "steps": 0,
                                   "exports": 0} for m in config["methods"]}  # fmt: skip
    for method, lr, stage in sweep(config):
        folder = run_dir(config, method, lr, stage)
        if folder in seen_runs:
            continue
        seen_runs.add(folder)
        found = counts[method]
        found["runs"].add(folder)
        found["lrs"].add(lr)
        if method_options(config, method).get("osft"):
            cache = svd_dir(config, method, lr, stage)
            if cache not in seen_svd:
                seen_svd.add(cache)
                found["svd"].add(cache)
        args = TrainingArgs(**training_options(config, method, lr, stage), output_dir=folder)
        samples = size(train_file(config, stage_dataset(config, method, stage)))
        steps, exports = run_outputs(args, None if samples is None else samples.lines)
        for key, value in (("steps", steps), ("exports", exports)):
            found[key] = None if value is None or found[key] is None else found[key] + value
    files = data_outputs(config)
    evaluated = {evaluated_source(config, source) for source in eval_sources(config)}
    validated = {train_file(config, stage_dataset(config, m, i)) for m, _, i in sweep(config)}
    methods = {
        m: MethodRuns(len(c["runs"]), len(c["lrs"]), len(c["svd"]), c["steps"], c["exports"])
        for m, c in counts.items()
    }
    return Experiment(
        methods=methods,
        keep_states_after_final=bool(config.get("keep_states_after_final", False)),
        best=all(validation_file(config, task) for task in config["stages"]),
        evaluations=len(all_eval_jsons(config)),
        data_files=tuple(files),
        jobs=len(seen_runs) + len(seen_svd) + len(evaluated) + len(files) + len(validated),
    )


def run_outputs(args: TrainingArgs, samples: int | None) -> tuple[int | None, int | None]:
    """(steps, `hf_format/` exports) of one run over a training file of `samples` lines, at
    most (early stopping may end it sooner), as the loop takes them: batches of `batch_size`,
    an epoch's last one the rest, and `checkpoint_policy.checkpoints_due` after each step.
    None where not known."""
    if samples is None or samples < 1:
        return (args.max_steps if args.training_mode == "step" else None), (
            0 if not (args.checkpoint_at_epoch or args.min_samples_per_checkpoint) else None
        )
    steps = planned_steps(args, samples)
    if steps is None:
        return None, None if args.checkpoint_at_epoch or args.min_samples_per_checkpoint else 0
    if not (args.checkpoint_at_epoch or args.min_samples_per_checkpoint):
        return steps, 0
    exports, seen, last, position = 0, 0, 0, 0
    for step in range(1, steps + 1):
        taken = min(args.batch_size, samples - position)
        position = (position + taken) % samples
        seen += taken
        due = checkpoints_due(args, step=step, samples_seen=seen, samples_at_last_checkpoint=last,
                              ends_epoch=position == 0, stop_requested=False)  # fmt: skip
        if due.exports:
            exports, last = exports + 1, seen
    return steps, exports


def data_outputs(config: Config) -> list[str]:
    """The files the data rules write under results/data: every run's training file that a rule
    makes (a mixture, a task less its validation split, a tokenized chat file), the inputs of
    those, validation splits and tokenized eval files; each once, in DAG order."""
    files: dict[str, None] = {}

    def add(path: str) -> None:
        if not path.startswith("results/data/") or path in files:
            return
        files[path] = None
        name = path.removeprefix("results/data/").removesuffix(".jsonl")
        if name.startswith(data.MIX_PREFIX):
            for source, _, _ in mix_inputs(config, name.removeprefix(data.MIX_PREFIX)):
                add(source)
        elif name.endswith(".split.train"):
            add(task_file(config, name.removesuffix(".split.train"), "train"))

    for method, _, stage in sweep(config):
        add(train_file(config, stage_dataset(config, method, stage)))
    for task in config["stages"]:
        add(validation_file(config, task) or "")
        add(task_file(config, task, "eval"))
    return list(files)
