"""The Snakemake pipeline, run for real with the `snakemake` of this environment.

Each test works in a temporary copy of the workflow (Snakefile, workflow/, config/, profiles/)
with its own config/config.yaml, so nothing is written into the checkout. Rules import the
package through the interpreter that runs Snakemake (`"$MINI_TRAINER_PYTHON" -m mini_trainer`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from helpers import REPO_ROOT, make_workdir, subprocess_env, write_config

EXAMPLE_8GPU = "config/examples/llama-3.1-8b-8gpu.yaml"


def snakemake_command() -> list[str]:
    """The `snakemake` next to this interpreter (the venv's), else `python -m snakemake`."""
    beside = Path(sys.executable).parent / "snakemake"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "snakemake"]


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*snakemake_command(), *args],
        cwd=workdir,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if result.returncode != 0:
        raise AssertionError(
            f"snakemake failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
            f"{result.stderr[-5000:]}"
        )
    return result


def planned_jobs(dry_run: subprocess.CompletedProcess) -> list[tuple[str, str]]:
    """(rule, output) of every job a `snakemake -n` run lists."""
    text = check(dry_run).stdout + dry_run.stderr
    jobs = []
    for match in re.finditer(r"^(?:local)?rule (\w+):\n((?:    .*\n)*)", text, re.MULTILINE):
        output = re.search(r"^    output: (.*)$", match.group(2), re.MULTILINE)
        jobs.append((match.group(1), output.group(1) if output else ""))
    return jobs


def rule_counts(jobs: list[tuple[str, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rule, _ in jobs:
        counts[rule] = counts.get(rule, 0) + 1
    return counts


def demo_config(**overrides) -> dict:
    """A small demo config: two stages, short trainings, states every 4 steps."""
    config = {
        "model": "demo",
        "stages": ["sort", "sort_desc"],
        "launch": {"nproc_per_node": 2},
        "training": {
            "batch_size": 16,
            "max_tokens_per_gpu": 2048,
            "training_mode": "step",
            "max_steps": 24,
            "num_warmup_steps": 2,
            "lr_scheduler": "cosine",
            "save_every_steps": 4,
            "save_dtype": "float32",
        },
        "methods": {"sft": {"learning_rates": [0.01]}},
    }
    config.update(overrides)
    return config


# ---------------------------------------------------------------------------------------------
# Static checks: lint, dry runs, config validation.


def test_lint_default_config():
    result = check(snakemake(REPO_ROOT, "--lint"))
    assert "Congratulations" in result.stdout + result.stderr


def test_dry_run_default_config_plans_the_whole_experiment(tmp_path):
    """sft and osft at 2 learning rates and replay at 1, x 3 stages, evaluated with the base
    model on 3 tasks."""
    workdir = make_workdir(tmp_path / "w")
    jobs = planned_jobs(snakemake(workdir, "-n"))
    assert rule_counts(jobs) == {
        "demo_assets": 1,
        "mix": 2,  # replay's stages 2 and 3
        "validate": 3 + 2,
        "osft_svd": 1 + 2 * 2,  # the base model's, shared, then stages 2 and 3 per osft lr
        "train": 14,  # replay's stage 1 is sft's at lr 0.01 (same run key): trained once
        "evaluate": 1 + 14,  # and evaluated once; one job per checkpoint scores all 3 tasks
        "manifest": 1,
        "report": 1,
        "all": 1,
    }
    svd_outputs = sorted(out for rule, out in jobs if rule == "osft_svd")
    assert svd_outputs[0] == "results/osft_svd/base/default-targets"
    check_docs_against_the_plan(jobs)
    # Stage 2 of each lr starts from that lr's stage 1: its run folder names the SVD.
    train_outputs = [out for rule, out in jobs if rule == "train"]
    stage1 = {o.rsplit("/final", 1)[0] for o in train_outputs if "/stage1/" in o}
    assert all(
        any(out == f"results/osft_svd/{run.removeprefix('results/train/')}/default-targets"
            for out in svd_outputs)
        for run in stage1 if "/osft/" in run
    )  # fmt: skip


def check_docs_against_the_plan(jobs: list[tuple[str, str]]) -> None:
    """What README.md and docs/pipeline.md state about the default experiment holds for this
    plan: its job count, and no command block writes (without --force) into a path the Set-up
    command's pipeline has already built (it would stop with "already exists")."""
    from test_docs import OUTPUT_FLAGS, docs_commands, stated_counts

    stated = stated_counts("jobs", ("README.md", "docs/pipeline.md"))
    assert stated, "README.md and docs/pipeline.md state no job count"
    wrong = [f"{where}: {n} jobs" for where, n in stated if n != len(jobs)]
    assert not wrong, f"{wrong}; `snakemake -n` plans {len(jobs)} jobs"
    built = [Path(out) for _, outs in jobs for out in outs.split(", ") if out]
    clashes = []
    for command in docs_commands():
        words = command.words
        if "--force" in words:
            continue
        for i, word in enumerate(words[:-1]):
            target = Path(words[i + 1])
            if word in OUTPUT_FLAGS and any(
                target == out or target in out.parents or out in target.parents for out in built
            ):
                clashes.append(f"{command.where}: {word} {target}")
    assert not clashes, f"after Set-up these outputs already exist: {clashes}"


def test_dry_run_sft_only_example_has_no_osft_job(tmp_path):
    workdir = make_workdir(tmp_path / "w")
    args = ("--configfile", "config/examples/demo-sft.yaml", "--replace-workflow-config")
    counts = rule_counts(planned_jobs(snakemake(workdir, "-n", *args)))
    assert "osft_svd" not in counts
    # One evaluate job per checkpoint (the base model and six runs) scores all three tasks.
    assert counts["train"] == 6 and counts["evaluate"] == 1 + 6


def _example_workdir(tmp_path: Path) -> Path:
    """A workdir with empty stand-ins for the example's model folder and data files."""
    workdir = make_workdir(tmp_path / "w")
    example = yaml.safe_load((REPO_ROOT / EXAMPLE_8GPU).read_text())
    (workdir / example["model"]).mkdir(parents=True)
    for files in example["tasks"].values():
        for path in files.values():
            (workdir / path).parent.mkdir(parents=True, exist_ok=True)
            (workdir / path).touch()
    return workdir


def test_example_8gpu_lints_and_dry_runs(tmp_path):
    workdir = _example_workdir(tmp_path)
    args = ("--configfile", EXAMPLE_8GPU, "--replace-workflow-config")
    check(snakemake(workdir, "--lint", *args))
    result = snakemake(workdir, "-n", "-p", "--cores", "16", *args)
    jobs = planned_jobs(result)
    assert rule_counts(jobs)["train"] == 12
    assert "demo_assets" not in rule_counts(jobs)
    command = next(line for line in result.stdout.splitlines() if "mini_trainer launch" in line)
    assert "--nproc-per-node 8" in command
    assert "--use-liger-kernels" in command and "--activation-checkpointing" in command
    assert "--save-dtype bfloat16" in command
    resources = re.findall(r"resources: .*\bgres=gpu:(\d+), tasks_per_gpu=0", result.stdout)
    assert resources and set(resources) == {"8"}
    # One plan per method, listed (so run) before every training job.
    plans = sorted(out for rule, out in jobs if rule == "plan")
    assert plans == ["results/plan/osft.txt", "results/plan/sft.txt"]
    rules = [rule for rule, _ in jobs]
    assert max(i for i, r in enumerate(rules) if r == "plan") < rules.index("train")
    plan = next(line for line in result.stdout.splitlines() if "mini_trainer plan" in line)
    assert "--gpus-per-node 8 --gpu-memory-gib 80" in plan and "--require-fit" in plan


@pytest.mark.slow
def test_plan_rule_stops_a_config_that_does_not_fit(tmp_path):
    """The 8B example planned on 1 GiB GPUs: the plan job fails (exit 4), nothing trains, and
    its log holds the table and the reason."""
    workdir = _example_workdir(tmp_path)
    model = workdir / "llama-8b"
    model.mkdir()
    shutil.copy2(REPO_ROOT / "tests/fixtures/plan/llama-3.1-8b/config.json", model)
    config = yaml.safe_load((REPO_ROOT / EXAMPLE_8GPU).read_text())
    config["model"] = "llama-8b"
    config["launch"]["gpu_memory_gib"] = 1
    write_config(workdir, config, "config/small-gpus.yaml")
    args = ("--configfile", "config/small-gpus.yaml", "--replace-workflow-config")
    result = snakemake(workdir, "--cores", "1", "results/plan/sft.txt", *args, timeout=1200)
    assert result.returncode != 0
    log = (workdir / "logs/plan/sft.log").read_text()
    assert "peak" in log.lower() and "error: the peak" in log and "does not fit in 1.0 GiB" in log
    assert not (workdir / "results/plan/sft.txt").exists()
    assert not (workdir / "results/train").exists()


BAD_CONFIGS = [
        ({"training": {"max_tokens_per_gpu": 2048, "batch_size": "big"}}, "batch_size"),
        ({"training": {"max_tokens_per_gpu": 2048, "batch_sise": 8}}, "batch_sise"),
        ({"evaluation": {"max_tokens_per_gpu": 0}}, "max_tokens_per_gpu"),
        ({"lerning_rate": 0.1}, "lerning_rate"),
        ({"methods": {"base": {"learning_rates": [0.01]}}}, "base"),
        ({"methods": {"sft": {"learning_rates": [0.01], "trainig": {}}}}, "trainig"),
        ({"stages": ["sort", "sortt"]}, "stages[1]"),
        ({"methods": {"x": {"learning_rates": [0.1], "training": {"osft": True}}}},
         "methods.x.training.osft_unfreeze_rank_ratio"),
        ({"tasks": {"t": {"train": "a", "eval": "b", "format": "sharegpt"}}}, "tasks.t.format"),
        ({"mixtures": {"sort": {"sort": 1, "nope": 0.1}}}, "mixtures.sort.nope"),
        ({"methods": {"r": {"learning_rates": [0.1], "replay_fraction": 1.5}}},
         "methods.r.replay_fraction"),
]  # fmt: skip
"""(change to the default config, the key its error must name)."""


@pytest.mark.parametrize(("change", "key"), [BAD_CONFIGS[1], BAD_CONFIGS[6]])
def test_bad_config_fails_at_once_naming_the_key(tmp_path, change, key):
    """Through snakemake: a schema error and an error of the checks beyond the schema."""
    workdir = make_workdir(tmp_path / "w")
    config = yaml.safe_load((workdir / "config/config.yaml").read_text())
    config.update(change)
    write_config(workdir, config)
    result = snakemake(workdir, "-n", timeout=120)
    assert result.returncode != 0
    message = result.stdout + result.stderr
    assert key in message, message[-3000:]
    assert not (workdir / "results").exists()


@pytest.mark.parametrize(("change", "key"), BAD_CONFIGS)
def test_each_bad_config_is_refused_naming_the_key(change, key):
    """What the Snakefile runs on a config before any job (its schema, then the package's
    checks), in this process: no Snakemake start-up per case."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    from mini_trainer.pipeline import check_config
    from mini_trainer.pipeline.errors import ConfigError

    config = yaml.safe_load((REPO_ROOT / "config/config.yaml").read_text())
    config.update(change)
    with pytest.raises((WorkflowError, ConfigError)) as refused:
        validate(config, str(REPO_ROOT / "workflow/schemas/config.schema.yaml"))
        check_config(config)
    assert key in str(refused.value), str(refused.value)[-3000:]


def test_config_keys_cover_the_training_flags():
    """Every TrainingArgs field is a config option or set by the pipeline, and no option is
    unknown to the engine."""
    from mini_trainer.training_args import TrainingArgs

    schema = yaml.safe_load((REPO_ROOT / "workflow/schemas/config.schema.yaml").read_text())
    options = set(schema["$defs"]["training_options"]["properties"])
    set_by_pipeline = {
        "model_name_or_path", "data_path", "data_index", "output_dir", "learning_rate",
        "resume", "save_final_checkpoint", "osft_svd_cache", "wandb_run_name",
        "model_revision",  # the commit of the top-level model_revision (a Hub model)
        "validation_data_path", "save_best",
        "ewc_fisher",  # the ewc_fisher rule's folder of the previous stage
        "drop_states_after_final",  # from keep_states_after_final, through a resource
    }  # fmt: skip
    fields = {f.name for f in dataclasses.fields(TrainingArgs)}
    assert options <= fields
    assert options | set_by_pipeline == fields


def test_demo_tasks_match_the_package():
    from mini_trainer.demo.tasks import TASKS
    from mini_trainer.pipeline import DEMO_TASKS

    assert list(TASKS) == DEMO_TASKS


def test_config_yaml_syntax_error_names_file_and_line(tmp_path):
    """Snakemake's own message names neither; the Snakefile reads the file first."""
    workdir = make_workdir(tmp_path / "w")
    config = workdir / "config/config.yaml"
    lines = config.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("training:"))
    lines.insert(at + 1, "  batch_size: 32: 4")  # line at + 2
    config.write_text("\n".join(lines) + "\n")
    result = snakemake(workdir, "-n", timeout=120)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if not line.startswith("Using ")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(f"config/config.yaml:{at + 2}: YAML syntax error: "), errors
    assert not (workdir / "results").exists()


def test_empty_model_revision_stops_the_pipeline_with_one_line(tmp_path):
    """Not taken as main, and not the schema's several lines: the file and key, exit 2."""
    workdir = make_workdir(tmp_path / "w")
    (workdir / "other.yaml").write_text("model_revision: ''\n")
    result = snakemake(workdir, "-n", "--configfile", "other.yaml", timeout=120)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if not line.startswith("Using ")]
    assert errors == [
        f"{workdir / 'other.yaml'}: model_revision: empty (''); name a branch, tag or commit, "
        "or leave the key out for main"
    ], result.stderr


def test_warmup_longer_than_max_steps_fails_at_config_check(tmp_path):
    """The engine's cross-option rules are the pipeline's: one line, before any job."""
    config = demo_config()
    config["training"]["num_warmup_steps"] = 30  # max_steps: 24
    workdir = make_workdir(tmp_path / "w", config)
    result = snakemake(workdir, "-n", timeout=120)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if not line.startswith("Using ")]
    assert errors == [
        "config: training.num_warmup_steps (method sft): 30 is more than max_steps 24 "
        "(the learning rate would never reach its peak)"
    ]
    assert not (workdir / "results").exists()


def test_run_key_follows_the_options(tmp_path):
    """A changed training option (or an upstream stage's) moves the run folder: a fresh run."""
    workdir = make_workdir(tmp_path / "w", demo_config())

    def train_outputs() -> dict[str, str]:
        jobs = planned_jobs(snakemake(workdir, "-n", "trainings"))
        return {out.split("/")[4]: out for rule, out in jobs if rule == "train"}

    before = train_outputs()
    assert set(before) == {"stage1", "stage2"}
    write_config(workdir, demo_config(stages=["sort", "sort_plus1"]))
    changed_stage2 = train_outputs()
    assert changed_stage2["stage1"] == before["stage1"]
    assert changed_stage2["stage2"] != before["stage2"]
    config = demo_config()
    config["training"]["max_steps"] = 25
    write_config(workdir, config)
    changed_all = train_outputs()
    assert all(changed_all[s] != before[s] for s in before)


# ---------------------------------------------------------------------------------------------
# The whole DAG (needs `mini-trainer osft-svd`, `evaluate` and `report`).


# Stage 2 of the full run is a chat-format task (tokenized by the DAG), and a replay method runs
# beside sft and osft.
CHAT_TASK = "sort_desc_chat"
CHAT_SAMPLES = {"train": 300, "eval": 40}


def _write_chat_task(workdir: Path) -> None:
    """Chat JSONL of the demo's sort_desc task (the demo tokenizer's template renders it)."""
    import random

    from mini_trainer.demo.tasks import make_conversation

    rng = random.Random(0)
    (workdir / "chat").mkdir(exist_ok=True)
    for split, count in CHAT_SAMPLES.items():
        lines = [
            json.dumps({"messages": make_conversation("sort_desc", rng)}) for _ in range(count)
        ]
        (workdir / f"chat/{CHAT_TASK}.{split}.jsonl").write_text("\n".join(lines) + "\n")


def _full_config() -> dict:
    return demo_config(
        stages=["sort", CHAT_TASK],
        tasks={
            CHAT_TASK: {
                "train": f"chat/{CHAT_TASK}.train.jsonl",
                "eval": f"chat/{CHAT_TASK}.eval.jsonl",
                "format": "chat",
            }
        },
        methods={
            "sft": {"learning_rates": [0.01]},
            "osft": {
                "learning_rates": [0.03],
                "training": {"osft": True, "osft_unfreeze_rank_ratio": 0.5},
            },
            "replay": {"learning_rates": [0.01], "replay_fraction": 0.1},
        },
        training={**demo_config()["training"], "max_steps": 12, "save_every_steps": 6},
        # One rank per training job: a job's cost here is its processes' start-up, and the
        # pipeline passes ranks through unchanged (2 ranks: the Slurm pipeline run).
        launch={"nproc_per_node": 1},
    )


# `full_run` (tests/pipeline_runs.py, a session fixture): the run of _full_config() that the
# tests below and tests/test_report.py's browser test share.
FULL_ROWS = (("sft", 0.01), ("osft", 0.03), ("replay", 0.01))


@pytest.mark.slow
def test_full_run_report_has_every_cell(full_run):
    report = full_run / "results/report/report.html"
    assert report.exists()
    manifest = json.loads((full_run / "results/manifest.json").read_text())
    assert manifest["tasks"] == ["sort", CHAT_TASK]
    cells = {
        (e["method"], e["lr"], e["stage"], e["task"]): e["path"]
        for e in manifest["entries"]
        if e["kind"] == "eval"
    }
    rows = [(None, None, 0)] + [(m, lr, s) for m, lr in FULL_ROWS for s in (1, 2)]
    assert set(cells) == {(*row, task) for row in rows for task in manifest["tasks"]}
    for path in cells.values():
        accuracy = json.loads((full_run / path).read_text())["token_accuracy"]
        assert math.isfinite(accuracy) and 0.0 <= accuracy <= 1.0
    # The report's own view of the matrix: no cell shown as missing, AA and BWT computed (they
    # need every cell) for each (method, lr), and one matrix figure each.
    html = report.read_text()
    assert 'class="missing"' not in html
    for method, lr in FULL_ROWS:
        row = re.search(
            rf"<tr><td>{method}</td><td>{lr}</td><td class=\"num\">2</td>"
            r'<td class="num">([0-9.]+)%</td><td class="num">([+-][0-9.]+) pt</td>',
            html,
        )
        assert row, f"no AA/BWT row for {method} lr {lr}"
        assert (full_run / f"results/report/matrix_{method}_lr{lr}.png").stat().st_size > 0
    runs = [e for e in manifest["entries"] if e["kind"] == "run"]
    assert len(runs) == 6 and all((full_run / e["path"] / "metrics.jsonl").exists() for e in runs)
    assert "Not on the plot" not in html  # every (method, lr) is a point of the frontier
    # The chat task's row in the data section (task, training file, contents, samples): every
    # conversation kept (none is too long); replay's mixture for that stage has its own row.
    assert re.search(
        rf"<tr><td>{CHAT_TASK}</td><td>[^<]*</td><td></td><td class=\"num\">"
        rf"{CHAT_SAMPLES['train']}</td>",
        html,
    )
    assert re.search(rf"<tr><td>{CHAT_TASK}</td><td>results/data/mix/[^<]*</td><td>mixture: ", html)


@pytest.mark.slow
def test_full_run_chat_task_is_tokenized_and_replay_trains_on_its_mixture(full_run):
    tokenized = full_run / f"results/data/tokenized/{CHAT_TASK}.train.jsonl"
    assert len(tokenized.read_text().splitlines()) == CHAT_SAMPLES["train"]
    assert (full_run / f"logs/tokenize/{CHAT_TASK}.eval.log").exists()
    entries = json.loads((full_run / "results/manifest.json").read_text())["entries"]
    runs = {(e["method"], e["stage"]): e["path"] for e in entries if e["kind"] == "run"}
    data_of = {
        key: json.loads((full_run / path / "training_args.json").read_text())["data_path"]
        for key, path in runs.items()
    }
    # Stage 1 of replay trains on the task as sft does (the same run: one folder, trained and
    # evaluated once); stage 2 on the task plus 10% of sort's, starting from that run.
    assert runs[("replay", 1)] == runs[("sft", 1)]
    replay2 = json.loads((full_run / runs[("replay", 2)] / "training_args.json").read_text())
    assert replay2["model_name_or_path"] == f"{runs[('sft', 1)]}/final"
    assert data_of[("sft", 2)] == str(tokenized.relative_to(full_run))
    mix = f"results/data/mix/{CHAT_TASK}-replay0.1"
    assert data_of[("replay", 2)] == f"{mix}.jsonl"
    sidecar = json.loads((full_run / f"{mix}.mix.json").read_text())
    assert [(i["kind"], i["chosen"]) for i in sidecar["inputs"]] == [
        ("weight", CHAT_SAMPLES["train"]), ("replay", 200)]  # fmt: skip
    assert len((full_run / f"{mix}.jsonl").read_text().splitlines()) == sidecar["samples"] == 500


@pytest.mark.slow
def test_killed_training_resumes_from_its_state(full_run_attempts):
    """The first attempt's training job, SIGKILLed after its first state, resumed from it."""
    workdir, killed = full_run_attempts["workdir"], full_run_attempts["killed"]
    parts = killed.relative_to(workdir).parts  # results/train/M/lrX/stageK/KEY
    log = workdir / "logs" / Path(*parts[1:]).with_suffix(".log")
    text = log.read_text()
    match = re.search(r"resumed from \S*state/step_(\d+) \(step (\d+)\)", text)
    assert match, text[-3000:]
    max_steps = _full_config()["training"]["max_steps"]
    assert 1 <= int(match.group(2)) < max_steps
    steps = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").open()]
    assert steps == list(range(1, max_steps + 1))
    assert (killed / "final" / "config.json").exists()


@pytest.mark.slow
def test_one_method_change_reruns_only_that_method(full_run):
    config = _full_config()
    config["methods"]["osft"]["training"]["osft_unfreeze_rank_ratio"] = 0.25
    changed = write_config(full_run, config, "config/osft-changed.yaml")
    jobs = planned_jobs(
        snakemake(full_run, "-n", "trainings", "--configfile", str(changed),
                  "--replace-workflow-config")
    )  # fmt: skip
    trains = [out for rule, out in jobs if rule == "train"]
    assert len(trains) == 2 and all("/osft/" in out for out in trains), jobs


@pytest.mark.slow
def test_full_run_second_run_does_nothing(full_run):
    """Nothing reruns, although every finished run dropped its states (final/ is the output)."""
    assert len(list(full_run.glob("results/train/*/*/stage*/*/final"))) == 5
    assert not list(full_run.glob("results/train/*/*/stage*/*/state"))
    result = check(snakemake(full_run, "-n"))
    assert "Nothing to be done" in result.stdout + result.stderr
    # Keeping states from now on is a resource of the train jobs, no parameter: nothing reruns.
    kept = write_config(full_run, {**_full_config(), "keep_states_after_final": True},
                        "config/keep-states.yaml")  # fmt: skip
    args = ("-n", "--configfile", str(kept), "--replace-workflow-config")
    result = check(snakemake(full_run, *args))
    assert "Nothing to be done" in result.stdout + result.stderr


@pytest.mark.slow
def test_evaluation_change_reruns_only_evaluation_and_report(full_run):
    config = _full_config()
    config["evaluation"] = {"max_tokens_per_gpu": 4096}
    changed = write_config(full_run, config, "config/eval-changed.yaml")
    jobs = planned_jobs(
        snakemake(full_run, "-n", "--configfile", str(changed), "--replace-workflow-config")
    )
    # The base model and five runs, each job scoring both tasks.
    assert rule_counts(jobs) == {"evaluate": 6, "manifest": 1, "report": 1, "all": 1}


@pytest.mark.slow
def test_model_change_reruns_tokenization_and_what_follows(full_run):
    """Another model folder (here: a copy of the demo model) means another tokenizer."""
    shutil.copytree(full_run / "resources/demo/model", full_run / "other_model")
    config = _full_config()
    config["model"] = "other_model"
    config["tasks"]["sort"] = {
        "train": "resources/demo/data/sort.train.jsonl",
        "eval": "resources/demo/data/sort.eval.jsonl",
    }
    changed = write_config(full_run, config, "config/model-changed.yaml")
    dry_run = snakemake(full_run, "-n", "--configfile", str(changed), "--replace-workflow-config")
    counts = rule_counts(planned_jobs(dry_run))
    assert counts["tokenize"] == 2 and counts["mix"] == 1 and counts["train"] == 5
    assert "demo_assets" not in counts


@pytest.mark.slow
def test_snakemake_report_carries_the_report(full_run, tmp_path):
    out = tmp_path / "report.zip"
    check(snakemake(full_run, "--report", str(out)))
    with zipfile.ZipFile(out) as archive:
        names = archive.namelist()
    assert any(name.endswith("report.html") for name in names if "/data/" in name), names
