"""What each pipeline training job trains on (chat tasks, mixtures, replay), and the config
checks of those keys: pure functions of the config, no Snakemake."""

from __future__ import annotations

import copy

import pytest

from mini_trainer.pipeline.data import (
    DataConfigError,
    check_data_config,
    mix_inputs,
    mix_inputs_of_name,
    mix_name,
    task_format,
)

DEMO_TASKS = ["sort", "sort_desc", "sort_plus1"]
CONFIG = {
    "model": "demo",
    "tasks": {
        "chat_task": {"train": "c.train.jsonl", "eval": "c.eval.jsonl", "format": "chat"},
        "general": {"train": "g.jsonl"},
    },
    "stages": ["sort", "chat_task", "sort_desc"],
    "mixtures": {"chat_task": {"chat_task": 0.9, "general": 0.1}},
    "methods": {
        "sft": {"learning_rates": [0.01]},
        "replay": {"learning_rates": [0.01], "replay_fraction": 0.25},
        "replay2": {"learning_rates": [0.03], "replay_fraction": 0.25},
    },
}


def test_formats_default_to_pre_tokenized():
    assert task_format(CONFIG, "chat_task") == "chat"
    assert task_format(CONFIG, "general") == "tokenized"
    assert task_format(CONFIG, "sort") == "tokenized"


def test_what_each_method_and_stage_trains_on():
    # Plain SFT: its task, except where the stage has a mixture.
    assert mix_inputs(CONFIG, "sft", 1) is None and mix_name(CONFIG, "sft", 1) is None
    assert mix_inputs(CONFIG, "sft", 2) == [
        ("chat_task", "weight", 0.9),
        ("general", "weight", 0.1),
    ]
    assert mix_name(CONFIG, "sft", 2) == "mix/chat_task"
    # Replay: nothing to replay at stage 1; then every earlier stage's task, on top of the mixture.
    assert mix_inputs(CONFIG, "replay", 1) is None
    assert mix_inputs(CONFIG, "replay", 3) == [
        ("sort_desc", "weight", 1.0),
        ("sort", "replay", 0.25),
        ("chat_task", "replay", 0.25),
    ]
    assert mix_inputs(CONFIG, "replay", 2)[-1] == ("sort", "replay", 0.25)
    # Methods with the same fraction share one mixture file; the name maps back to its inputs.
    assert (
        mix_name(CONFIG, "replay", 3)
        == mix_name(CONFIG, "replay2", 3)
        == "mix/sort_desc-replay0.25"
    )
    for method in CONFIG["methods"]:
        for stage in (1, 2, 3):
            name = mix_name(CONFIG, method, stage)
            if name:
                assert mix_inputs_of_name(CONFIG, name) == mix_inputs(CONFIG, method, stage)


def test_the_default_config_is_accepted():
    check_data_config(CONFIG, DEMO_TASKS)


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("tasks.chat_task.format", "sharegpt", "unknown format 'sharegpt'"),
        ("mixtures.chat_task.general", -0.1, "must be a number >= 0"),
        ("mixtures.chat_task.nope", 0.1, "unknown dataset"),
        ("mixtures.chat_task.chat_task", 0, "positive weight"),
        ("mixtures.sort_plus1", {"sort": 1}, "is not a stage"),
        ("methods.replay.replay_fraction", 1.5, "outside [0, 1]"),
        ("methods.replay.replay_fraction", -0.5, "outside [0, 1]"),
    ],
)  # fmt: skip
def test_bad_data_keys_name_the_key(key, value, reason):
    config = copy.deepcopy(CONFIG)
    target, path = config, key.split(".")
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    with pytest.raises(DataConfigError) as raised:
        check_data_config(config, DEMO_TASKS)
    assert raised.value.key == key and reason in raised.value.reason
    assert "\n" not in str(raised.value)


def test_zero_sum_weights_are_refused():
    config = copy.deepcopy(CONFIG)
    config["mixtures"]["chat_task"] = {"chat_task": 0, "general": 0}
    with pytest.raises(DataConfigError, match="the weights sum to zero"):
        check_data_config(config, DEMO_TASKS)


def test_a_stage_task_needs_an_eval_file():
    config = copy.deepcopy(CONFIG)
    config["stages"] = ["sort", "general"]
    config["mixtures"] = {}
    with pytest.raises(DataConfigError, match="tasks.general.eval: required"):
        check_data_config(config, DEMO_TASKS)
