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


def test_the_default_is_decided_by_one_rule_with_its_reason(monkeypatch):
    """On where the node's staged copy fits in half its available host memory, off otherwise
    or where the memory is not known; the flags force either way; an optimizer whose state
    cannot be staged is off by default and refused when forced."""
    from mini_trainer import async_save_options as rule

    gib = 1024**3
    assert rule.decide(True, "adamw", 10 * gib, gib).line == "async save: on (--async-save)"
    assert rule.decide(False, "adamw", 1, 10 * gib).line == "async save: off (--no-async-save)"
    fits = rule.decide(None, "adamw", 5 * gib, 10 * gib)
    assert fits.on and "5.00 GiB per node, fits in 50% of the node's available host memory " \
        "(10.00 GiB)" in fits.line  # fmt: skip
    over = rule.decide(None, "adamw", 5 * gib + 1, 10 * gib)
    assert not over.on and "is more than 50%" in over.reason
    unknown = rule.decide(None, "adamw", 1, None)
    assert not unknown.on and "not known" in unknown.reason
    assert rule.decide(None, "adamw-8bit", 1, 10 * gib).on  # its moments stage (test below)
    assert rule.mem_available("MemTotal: 9 kB\nMemAvailable:    2048 kB\n") == 2048 * 1024
    assert rule.mem_available("MemTotal: 9 kB\n") is None
    monkeypatch.setitem(rule.UNSTAGEABLE_OPTIMIZERS, "adamw-8bit", "not copyable")
    refused = rule.decide(None, "adamw-8bit", 1, 10 * gib)
    assert refused.line == "async save: off (default: --optimizer adamw-8bit: not copyable)"
    with pytest.raises(UserError, match=r"--async-save: not with --optimizer adamw-8bit \(not"):
        TrainingArgs(model_name_or_path="m", data_path="d", output_dir="o",
                     async_save=True, optimizer="adamw-8bit")  # fmt: skip


def test_the_flags_force_it_either_way_through_every_entry():
    """`--async-save`, `--no-async-save` or neither (None, the default) survive the flags
    round trip of `run_training()` and the pipeline's command line."""
    from mini_trainer.pipeline.commands import cli_flags
    from mini_trainer.training_args import parse_training_args, to_cli_args

    required = ["--model-name-or-path", "m", "--data-path", "d", "--output-dir", "o"]
    for flags, value in (([], None), (["--async-save"], True), (["--no-async-save"], False)):
        args = parse_training_args([*required, *flags])
        assert args.async_save is value
        assert parse_training_args(to_cli_args(args)).async_save is value
    assert cli_flags({"async_save": False, "osft": False}) == "--no-async-save"
    assert cli_flags({"async_save": True}) == "--async-save"


def test_the_8bit_moments_are_staged_by_their_inner_tensors():
    """torchao's 8-bit state has no clone: its codes and scales are copied (and written over by
    the next save), so a snapshot holds the moments of the step it was taken at."""
    from torchao.optim.subclass_8bit import OptimState8bit

    live = OptimState8bit.zeros((8192,), signed=True, block_size=256, device="cpu")
    live.copy_(torch.linspace(-1, 1, 8192))
    staged = stage({"exp_avg": live})["exp_avg"]
    taken = live.dequantize().clone()
    live.copy_(torch.linspace(1, -1, 8192))
    assert type(staged) is OptimState8bit and torch.equal(staged.dequantize(), taken)
    assert staged_bytes(staged) == 8192 + 8192 // 256 * 4 + 256 * 4  # codes, scales, qmap
    again = stage({"exp_avg": live}, reuse={"exp_avg": staged})["exp_avg"]
    assert again.codes.data_ptr() == staged.codes.data_ptr() != live.codes.data_ptr()
    assert torch.equal(again.dequantize(), live.dequantize())


def test_a_run_measures_its_staged_copy_and_its_nodes_memory(world_of_one, tmp_path, monkeypatch):
    """`decide_for_run` counts the weights and the moments the first step will create (before
    any step: none exist yet), against MemAvailable read from /proc/meminfo's format."""
    from mini_trainer.training import async_save
    from mini_trainer.training_args import TrainingArgs

    model = torch.nn.Linear(64, 64)  # 4,160 fp32 weights
    optimizer = torch.optim.AdamW(model.parameters())
    args = TrainingArgs(model_name_or_path="m", data_path="d", output_dir="o")
    staged = 4160 * 4 * 3 + 2 * 4  # weights, two moments, two fp32 step counts: 49,928 bytes
    meminfo = tmp_path / "meminfo"
    monkeypatch.setattr(async_save, "MEMINFO", str(meminfo))
    monkeypatch.setattr(async_save, "CGROUP_ROOT", str(tmp_path))  # no memory cgroup limit
    (tmp_path / "cgroup").write_text("0::/\n")
    monkeypatch.setattr(async_save, "PROC_CGROUP", str(tmp_path / "cgroup"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # this rank's copy, times the node's ranks
    # the node's copy, 99,856 bytes, fits in half of 200 kB (204,800 bytes), not of 195 kB
    for available_kb, on in ((200, True), (195, False)):
        meminfo.write_text(f"MemTotal: 999 kB\nMemAvailable: {available_kb} kB\n")
        decision = async_save.decide_for_run(args, model, optimizer, world_of_one)
        assert decision.on is on, decision.reason
        assert f"{2 * staged / 1024:.2f} KiB per node" in decision.reason
    assert not optimizer.state  # measuring created no state
    meminfo.unlink()
    assert not async_save.decide_for_run(args, model, optimizer, world_of_one).on


def test_a_jobs_memory_cgroup_leaves_less_room_than_the_node(tmp_path):
    """A Slurm job's `--mem` (or a container's limit) is a memory cgroup: the least room
    (limit less usage) of the process's cgroup and its ancestors bounds what the default may
    use, v2 and v1; no limit ("max", v1's near-2^63) is no bound."""
    from mini_trainer.training.async_save import cgroup_room

    def write(folder, limit_file, limit, usage_file, usage):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / limit_file).write_text(f"{limit}\n")
        (folder / usage_file).write_text(f"{usage}\n")

    v2, files = tmp_path / "v2", ("memory.max", "memory.current")
    write(v2 / "job", files[0], 1000, files[1], 400)  # 600 left
    write(v2 / "job" / "task_0", files[0], "max", files[1], 100)
    assert cgroup_room(v2, "0::/job/task_0\n") == 600
    write(v2 / "job" / "task_0", files[0], 650, files[1], 100)  # 550 left
    assert cgroup_room(v2, "0::/job/task_0\n") == 550
    assert cgroup_room(v2, "0::/\n") is None  # the root: no limit files
    v1, files = tmp_path / "v1", ("memory.limit_in_bytes", "memory.usage_in_bytes")
    write(v1 / "memory" / "step", files[0], 9223372036854771712, files[1], 5)
    assert cgroup_room(v1, "4:memory:/step\n3:cpuset:/\n") is None
    write(v1 / "memory" / "step", files[0], 300, files[1], 500)
    assert cgroup_room(v1, "9:name=systemd:/\n4:memory:/step\n") == 0
