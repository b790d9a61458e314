"""The method seam's contract: every method is a `TrainingMethod`, writes its description to
OUT/method.json, and OSFT reuses recorded adaptive ranks only when resuming from a state."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import helpers
import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from mini_trainer.distributed.runtime import decided_on_main
from mini_trainer.method import (
    DESCRIPTION_FILE,
    FullFineTuning,
    MethodContext,
    TrainingMethod,
    write_description,
)
from mini_trainer.osft import svd
from mini_trainer.osft.method import OSFT, RANKS_FILE
from mini_trainer.training.method import make_method


def tiny_llama(layers=3):
    return helpers.tiny_llama(vocab_size=64, intermediate_size=48, num_hidden_layers=layers)


def adaptive_args(tmp_path: Path, **overrides) -> SimpleNamespace:
    values = dict(
        osft=True, osft_unfreeze_rank_ratio=None, osft_target_patterns=None,
        osft_rank_mode="adaptive", osft_min_frozen_ratio=0.1, osft_max_frozen_ratio=0.8,
        osft_svd_cache=None, osft_freeze_non_targets=False, output_dir=str(tmp_path / "out"),
        resume=True, model_name_or_path=str(tmp_path / "model"),
        data_path=str(tmp_path / "data.jsonl"), seed=0,
    )  # fmt: skip
    values.update(overrides)
    return SimpleNamespace(**values)


@pytest.fixture
def adaptive_run(tmp_path) -> SimpleNamespace:
    """A saved 3-layer model and data for adaptive OSFT; returns its arguments."""
    model = tiny_llama()
    model.save_pretrained(tmp_path / "model")
    rows = [{"input_ids": [(5 * i + j) % 64 for j in range(12)], "labels": []} for i in range(20)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return adaptive_args(tmp_path)


def adapt(args, resumed_from: Path | None) -> OSFT:
    method = OSFT(args)
    out = Path(args.output_dir)
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(args.model_name_or_path))
    method.adapt_model(model, MethodContext(None, out, resumed_from))
    return method


def tamper(path: Path, fraction: float) -> dict:
    """Rewrite the recorded layers of a description file with a recognizable fraction."""
    recorded = json.loads(path.read_text())
    for layer in recorded["layers"].values():
        layer["frozen_fraction"] = fraction
    path.write_text(json.dumps(recorded))
    return recorded


def test_every_method_is_a_training_method_and_writes_its_description(tmp_path):
    full = make_method(SimpleNamespace(osft=False))
    assert isinstance(full, FullFineTuning) and isinstance(full, TrainingMethod)
    assert isinstance(OSFT(adaptive_args(tmp_path)), TrainingMethod)
    path = write_description(full, tmp_path)
    assert path == tmp_path / DESCRIPTION_FILE
    assert json.loads(path.read_text()) == {"method": "full"}


def test_adaptive_ranks_are_measured_on_a_fresh_start_even_with_resume_and_a_leftover_file(
    adaptive_run,
):
    out = Path(adaptive_run.output_dir)
    measured = adapt(adaptive_run, resumed_from=None).layers
    assert all("importance" in layer for layer in measured.values())
    # An unsaved attempt left its ranks behind; this run starts fresh (no state): measure again.
    tamper(out / RANKS_FILE, 0.5)
    again = adapt(adaptive_run, resumed_from=None)
    assert again.layers == measured
    assert json.loads((out / RANKS_FILE).read_text())["layers"]["0"] == measured[0]


def test_adaptive_ranks_are_read_back_when_resuming_from_a_state(adaptive_run):
    out = Path(adaptive_run.output_dir)
    state = out / "state" / "step_4"
    first = adapt(adaptive_run, resumed_from=None)
    write_description(first, out)
    # method.json is the record; osft_ranks.json (older runs' only record) is its fallback.
    tamper(out / DESCRIPTION_FILE, 0.25)
    tamper(out / RANKS_FILE, 0.75)
    resumed = adapt(adaptive_run, resumed_from=state)
    assert {layer["frozen_fraction"] for layer in resumed.layers.values()} == {0.25}
    assert all(t.frozen == svd.frozen_rank(t.rank, 0.25) for t in resumed.targets.values())

    (out / DESCRIPTION_FILE).unlink()  # a run from before method.json
    tamper(out / RANKS_FILE, 0.75)
    old = adapt(adaptive_run, resumed_from=state)
    assert {layer["frozen_fraction"] for layer in old.layers.values()} == {0.75}


def test_decided_on_main_without_a_process_group_runs_the_decision():
    calls = []
    assert decided_on_main(lambda: calls.append(1) or ("a", 2), None) == ("a", 2)
    assert calls == [1]
