"""When a run ends: the mode's limit, --max-steps as a cap in every mode, the planned steps."""

from __future__ import annotations

import pytest

from mini_trainer.errors import UserError
from mini_trainer.training.stopping import finished, planned_steps
from mini_trainer.training_args import TrainingArgs


def args(**overrides):
    return TrainingArgs(**{"model_name_or_path": "m", "data_path": "d", "output_dir": "o",
                           **overrides})  # fmt: skip


def done(run, steps=0, epochs=0, tokens=0):
    return finished(run, steps=steps, epochs_completed=epochs, loss_tokens=tokens)


def test_each_mode_ends_at_its_own_limit():
    epoch = args(max_epochs=2)
    assert not done(epoch, steps=10**6, epochs=1, tokens=10**9) and done(epoch, epochs=2)
    step = args(training_mode="step", max_steps=10)
    assert not done(step, steps=9, epochs=99, tokens=10**9) and done(step, steps=10)
    token = args(training_mode="token", max_tokens=1000)
    assert not done(token, tokens=999, steps=10**6, epochs=99) and done(token, tokens=1000)
    assert not done(args(training_mode="infinite"), steps=10**6, epochs=10**6, tokens=10**12)


@pytest.mark.parametrize("mode", ["epoch", "token", "infinite"])
def test_max_steps_caps_every_mode_and_is_the_plan(mode):
    run = args(training_mode=mode, max_steps=5, max_tokens=10**9, max_epochs=100)
    assert not done(run, steps=4) and done(run, steps=5)
    assert planned_steps(run, num_samples=10_000) == 5


def test_planned_steps():
    assert planned_steps(args(max_epochs=3, batch_size=4), num_samples=10) == 9
    assert planned_steps(args(training_mode="infinite"), num_samples=10) is None
    with pytest.raises(UserError, match="--lr-scheduler cosine: needs a known number of steps"):
        planned_steps(args(training_mode="infinite", lr_scheduler="cosine"), num_samples=10)


def test_a_warm_up_longer_than_the_planned_steps_is_warned_about(caplog):
    import torch

    from mini_trainer.training.optimizer import build_scheduler

    run = args(num_warmup_steps=50, max_epochs=1, batch_size=4)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    total = planned_steps(run, num_samples=40)
    with caplog.at_level("WARNING", logger="mini_trainer"):
        build_scheduler(run, optimizer, total)
    assert "--num-warmup-steps 50 is more than the 10 planned steps" in caplog.text
