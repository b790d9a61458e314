"""`--async-save`'s parts in this process: the host snapshot, one write in flight, errors
raised where the training thread waits. (2 ranks, SIGKILL during a background write and the
bit-identical resume: test_train.py; SIGTERM waiting for it: test_train.py.)"""

from __future__ import annotations

import threading

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from mini_trainer.errors import UserError
from mini_trainer.training.async_save import BackgroundWriter, stage, staged_bytes
from mini_trainer.training_args import TrainingArgs


def test_a_staged_state_is_a_snapshot_that_training_cannot_change(world_of_one):
    mesh = init_device_mesh("cpu", (1,))
    weight = distribute_tensor(torch.arange(12.0).reshape(4, 3), mesh, [Shard(0)])
    moment = torch.ones(5)
    live = {
        "model": {"w": weight},
        "optim": {"state": {0: {"exp_avg": moment, "step": torch.tensor(3.0)}},
                  "param_groups": [{"lr": 0.1, "params": [0]}]},
    }  # fmt: skip
    staged = stage(live)
    with torch.no_grad():  # the next steps change the live tensors and values in place
        weight.to_local().add_(1)
        moment.mul_(2)
        live["optim"]["state"][0]["step"].add_(1)
    live["optim"]["param_groups"][0]["lr"] = 0.2
    assert type(staged["model"]["w"]) is type(weight)
    assert staged["model"]["w"].placements == weight.placements
    assert torch.equal(staged["model"]["w"].to_local(), torch.arange(12.0).reshape(4, 3))
    assert torch.equal(staged["optim"]["state"][0]["exp_avg"], torch.ones(5))
    assert staged["optim"]["state"][0]["step"].item() == 3.0
    assert staged["optim"]["param_groups"][0]["lr"] == 0.1
    assert staged_bytes(staged) == 12 * 4 + 5 * 4 + 4
    # The next save's snapshot is written into this one's memory (no new allocation).
    again = stage(live, reuse=staged)
    for path in (("model", "w"), ("optim", "state", 0, "exp_avg")):
        new, old, now = again, staged, live
        for key in path:
            new, old, now = new[key], old[key], now[key]
        if path[0] == "model":  # DTensors: their local shards
            new, old, now = new.to_local(), old.to_local(), now.to_local()
        assert new.data_ptr() == old.data_ptr() != now.data_ptr()
        assert torch.equal(new, now)


def test_one_write_in_flight_and_its_error_is_raised_where_training_waits(world_of_one):
    writer = BackgroundWriter(pin=False)
    release = threading.Event()
    writer.submit("state/step_1", lambda: release.wait(60))
    assert writer.in_flight == "state/step_1"
    with pytest.raises(RuntimeError, match="a save is in flight"):
        writer.submit("state/step_2", lambda: None)
    with pytest.raises(RuntimeError, match="a save is in flight"):  # its snapshot is in use
        writer.stage({"w": torch.ones(2)})
    release.set()
    assert writer.wait() == "state/step_1" and writer.in_flight is None
    assert writer.wait() is None

    def full_disk():
        raise OSError(28, "No space left on device")

    writer.submit("state/step_2", full_disk)
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    assert writer.in_flight is None


def test_async_save_is_refused_with_the_8bit_optimizer():
    with pytest.raises(UserError, match="--async-save: not with --optimizer adamw-8bit"):
        TrainingArgs(model_name_or_path="m", data_path="d", output_dir="o",
                     async_save=True, optimizer="adamw-8bit")  # fmt: skip
