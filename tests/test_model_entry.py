"""Model building and the loss as entry points: explicit parameters, the loss chosen per call.

Training and evaluation build the model through the same `build_model(ModelSpec, ...)` (no
stand-in argument object), and evaluation hands its statistics to each forward call instead of
reassigning the model's loss between micro-batches (issue 19, point 6).
"""

from __future__ import annotations

import functools
import json

import pytest
import torch
from helpers import tiny_llama

from mini_trainer.training.eval_stats import EvalSums, chunked_eval_stats, sample_ids_of
from mini_trainer.training.loss import chunked_linear_cross_entropy
from mini_trainer.training.model_setup import CausalLMWithLoss, ModelSpec
from mini_trainer.training_args import TrainingArgs


def tiny_model() -> CausalLMWithLoss:
    return CausalLMWithLoss(tiny_llama("eager"), chunked_linear_cross_entropy).eval()


def one_row(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A packed row of samples of `lengths`: ids, restarting positions, targets (-100 on the
    first half of each sample, as a prompt)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (1, sum(lengths)), generator=generator)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    targets = torch.randint(0, 97, (sum(lengths),), generator=generator)
    prompt = torch.cat([torch.arange(n) < n // 2 for n in lengths])
    targets[prompt] = -100
    return ids, positions, targets.unsqueeze(0)


def test_a_call_with_its_own_loss_leaves_the_model_as_it_was():
    model = tiny_model()
    own_loss = model.loss_fn
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    lengths = [6, 9, 4]
    ids, positions, targets = one_row(lengths)
    with torch.no_grad():
        before = model(ids, positions, targets)
        stats = functools.partial(
            chunked_eval_stats, sample_ids=sample_ids_of(lengths), num_samples=len(lengths)
        )
        sums = model(ids, positions, targets, loss_fn=stats)
        after = model(ids, positions, targets)
    # the call's own loss ran, with the model's head and this row's samples
    assert isinstance(sums, EvalSums)
    assert sums.sample_all_correct.shape == (len(lengths),)
    assert sums.num_loss_tokens == int((targets != -100).sum())
    assert sums.loss_sum.item() == pytest.approx(before.item(), rel=1e-6)
    # and the model is untouched: its loss, its weights, the loss it computes
    assert model.loss_fn is own_loss
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert torch.equal(before, after)


def test_a_model_built_without_a_loss_needs_one_per_call():
    model = tiny_model()
    bare = CausalLMWithLoss(model.model, None)
    ids, positions, targets = one_row([5, 7])
    with torch.no_grad(), pytest.raises(TypeError, match="pass loss_fn="):
        bare(ids, positions, targets)
    with torch.no_grad():
        loss = bare(ids, positions, targets, loss_fn=chunked_linear_cross_entropy)
        assert torch.equal(loss, model(ids, positions, targets))


def test_training_args_give_the_model_spec(tmp_path):
    args = TrainingArgs(
        model_name_or_path="some/model", data_path=str(tmp_path / "d.jsonl"),
        output_dir=str(tmp_path / "out"), activation_checkpointing=True, compile=True,
    )  # fmt: skip
    assert ModelSpec.of(args) == ModelSpec(
        "some/model", activation_checkpointing=True, cpu_offload=False, compile=True
    )
    plain = TrainingArgs(model_name_or_path="m", data_path="d", output_dir="o")
    assert ModelSpec.of(plain) == ModelSpec("m")


def test_evaluation_uses_the_training_builder_and_leaves_the_training_model_intact(
    demo_dir, tmp_path, monkeypatch
):
    """`evaluate_model` builds through `build_model` with a `ModelSpec`; `evaluate_loaded` on a
    model built for training (its own loss) leaves that loss and what it computes unchanged."""
    from mini_trainer.batching.collator import collate_packed
    from mini_trainer.distributed.runtime import init_runtime, shutdown
    from mini_trainer.evaluate import runner
    from mini_trainer.evaluate.runner import evaluate_model
    from mini_trainer.method import FullFineTuning
    from mini_trainer.training import model_setup
    from mini_trainer.training.evaluator import evaluate_loaded, load_eval_dataset

    model_dir = demo_dir / "model"
    lines = (demo_dir / "data" / "sort_plus1.eval.jsonl").read_text().splitlines()[:6]
    data = tmp_path / "eval.jsonl"
    data.write_text("\n".join(lines) + "\n")

    built = []
    real_build = model_setup.build_model

    def recording_build(spec, loss_fn, runtime, method, context=None):
        built.append((spec, loss_fn))
        return real_build(spec, loss_fn, runtime, method, context)

    # The builder as the evaluator sees it (imported by name into evaluate/runner.py).
    assert runner.build_model is model_setup.build_model
    monkeypatch.setattr(runner, "build_model", recording_build)
    runtime = init_runtime()
    try:
        result = evaluate_model(model_dir, data, runtime, max_tokens_per_gpu=512)
        assert built == [(ModelSpec(str(model_dir)), None)]

        model, config = real_build(
            ModelSpec(str(model_dir)), chunked_linear_cross_entropy, runtime, FullFineTuning()
        )
        model.eval()
        samples = [json.loads(line) for line in lines[:2]]
        micro = collate_packed(samples, 1, config.pad_token_id or 0)
        with torch.no_grad():
            before = model(micro.input_ids, micro.position_ids, micro.target_ids)
        dataset = load_eval_dataset(data, model_dir, 512, runtime)
        again = evaluate_loaded(model, dataset, runtime, 512, config.pad_token_id or 0)
        with torch.no_grad():
            after = model(micro.input_ids, micro.position_ids, micro.target_ids)
    finally:
        shutdown()
    assert model.loss_fn is chunked_linear_cross_entropy
    assert torch.equal(before, after)
    assert again["loss"] == pytest.approx(result["loss"], rel=1e-6)
    assert again["num_loss_tokens"] == result["num_loss_tokens"]
