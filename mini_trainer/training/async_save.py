"""Asynchronous state saves (`--async-save`): copy the state to host memory, write it in the
background, publish it only when every rank has written and hashed its part.

A synchronous save stops every rank until the last byte is written, checksummed and published
(`checkpoint.write_state`). With `--async-save` the training thread only copies the state
(weights, optimizer moments: this rank's shards) to host memory, pinned on CUDA, a plain copy on
the CPU, takes the RNG and trainer state of that moment, and hands `checkpoint.write_state` to
one background thread; training continues with the next step while it runs.

- At most one save is in flight: the next save, the end of the run and a stop (SIGTERM/SIGUSR1)
  first wait for it (`wait`), so a preempted job exits 75 only with its last state published.
- The background write is the synchronous save itself (same files, same `checksums.json`, same
  rename under `state/`), so a state is visible only when complete; a SIGKILL during the write
  leaves a temporary folder (removed at the next start) and the previous state intact.
- Its collectives (DCP's plan and metadata exchange, the ranks' agreement that every part is
  written, the shared hashing) run on a process group of their own (gloo, made once, at the
  first save, `new_group`), never on the training thread's group: two threads interleaving
  collectives on one group could pair different operations across ranks.
- An error in the background (a full disk) is raised by the next `wait`, on the training thread,
  where `save_guard.write_errors` turns it into its one line as for a synchronous save.

Why not `torch.distributed.checkpoint.async_save` (torch 2.13: a stager, then `save` in a
thread, on the group it is given): it is the same idea, but the checksums and the publishing
rename must follow the write on every rank in the same background job, and the files must be
those of a synchronous save; one job (`checkpoint.write_state`) that both paths run keeps them
equal by construction, and the staging stays a small function tested here.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from mini_trainer.async_save_options import AsyncSave, decide, mem_available
from mini_trainer.distributed.runtime import Runtime, all_reduce_max
from mini_trainer.training.optimizer import first_state_bytes, tensor_bytes

MEMINFO = "/proc/meminfo"
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_FILES = {
    "v2": ("memory.max", "memory.current"),
    "v1": ("memory.limit_in_bytes", "memory.usage_in_bytes"),
}
"""A memory cgroup's limit and usage files."""
NO_LIMIT = 1 << 62
"""A cgroup v1 limit at or above this is "no limit" (v1 writes 9223372036854771712)."""


def host_copy(tensor: torch.Tensor, pin: bool, reuse=None) -> torch.Tensor:
    """A copy of `tensor` in host memory that later training never changes (pinned on CUDA,
    so the copy from the device is asynchronous; synchronized by `BackgroundWriter.submit`).
    `reuse`: the previous save's copy of it, written over when its shape and dtype match (no
    new memory to allocate and fault in)."""
    if isinstance(tensor, DTensor):
        previous = reuse.to_local() if isinstance(reuse, DTensor) else None
        local = host_copy(tensor.to_local(), pin, previous)
        return DTensor.from_local(
            local, tensor.device_mesh, tensor.placements, run_check=False,
            shape=tensor.size(), stride=tensor.stride(),
        )  # fmt: skip
    if _is_subclass(tensor):  # torchao's 8-bit moments: its inner tensors (codes, scales)
        names, context = tensor.__tensor_flatten__()
        same = type(reuse) is type(tensor) and reuse.__tensor_flatten__() == (names, context)
        inner = {
            name: host_copy(getattr(tensor, name), pin, getattr(reuse, name) if same else None)
            for name in names
        }
        return type(tensor).__tensor_unflatten__(inner, context, tensor.size(), tensor.stride())
    tensor = tensor.detach()
    if (
        isinstance(reuse, torch.Tensor)
        and not isinstance(reuse, DTensor)
        and reuse.size() == tensor.size()
        and reuse.dtype == tensor.dtype
        and reuse.device.type == "cpu"
        and reuse.is_contiguous()
        and (reuse.is_pinned() or not pin)
    ):
        return reuse.copy_(tensor, non_blocking=pin)
    if tensor.device.type == "cpu":
        return tensor.clone()
    out = torch.empty(tensor.size(), dtype=tensor.dtype, pin_memory=pin)
    return out.copy_(tensor, non_blocking=pin)


def _is_subclass(tensor: torch.Tensor) -> bool:
    """A wrapper tensor subclass (not a DTensor) whose data are inner tensors."""
    return type(tensor) is not torch.Tensor and hasattr(type(tensor), "__tensor_flatten__")


def stage(state, pin: bool = False, reuse=None):
    """`state` (nested dicts and lists of tensors and plain values) with every tensor copied to
    host memory and every other value deep-copied: a snapshot training cannot change. `reuse`:
    an earlier snapshot of the same structure whose tensors may be written over."""
    if isinstance(state, torch.Tensor):
        return host_copy(state, pin, reuse)
    if isinstance(state, dict):
        previous = reuse if isinstance(reuse, dict) else {}
        return {key: stage(value, pin, previous.get(key)) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        same = isinstance(reuse, (list, tuple)) and len(reuse) == len(state)
        previous = reuse if same else [None] * len(state)
        return type(state)(stage(v, pin, p) for v, p in zip(state, previous, strict=True))
    return copy.deepcopy(state)


def staged_bytes(state) -> int:
    """Bytes of the tensors of `state` (this rank's shards): the host memory a staged copy
    takes while its write runs."""
    if isinstance(state, DTensor):
        return staged_bytes(state.to_local())
    if isinstance(state, torch.Tensor):
        return tensor_bytes(state)
    if isinstance(state, dict):
        return sum(staged_bytes(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return sum(staged_bytes(value) for value in state)
    return 0


class BackgroundWriter:
    """One background thread's worth of state writes, at most one in flight.

    Make it on every rank, and save on every rank at the same steps (its process group is made
    collectively, at the first save)."""

    def __init__(self, pin: bool):
        self.pin = pin
        """Stage into pinned host memory (CUDA)."""
        self._group = None
        self._future: Future | None = None
        self._what: str | None = None
        self._staged = None  # the last snapshot: its memory is reused by the next one

    @property
    def group(self):
        """The background writes' own process group, made at the first save (every rank saves
        at the same step): a run that saves no state makes none."""
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def release(self) -> None:
        """Free the held snapshot (the run saves no more states: its final export may use the
        memory). Only between writes."""
        if self._future is not None:
            raise RuntimeError(f"a save is in flight ({self._what}); wait for it first")
        self._staged = None

    def stage(self, state):
        """A host snapshot of `state` (`stage`), written into the previous save's snapshot where
        the tensors match: the copy then costs no allocation (the host memory stays held for
        the run, as the plan's host line counts it). Only between writes: never while one is
        in flight (its snapshot is what it writes)."""
        if self._future is not None:
            raise RuntimeError(f"a save is in flight ({self._what}); wait for it first")
        self._staged = stage(state, self.pin, self._staged)
        return self._staged

    @property
    def in_flight(self) -> str | None:
        """What the write in flight (or finished but not yet waited for) writes, else None."""
        return self._what

    def submit(self, what: str, job: Callable[[], object]) -> None:
        """Run `job` (it writes `what`) in the background; the previous write must be waited
        for first (`wait`), so at most one is in flight."""
        if self._future is not None:
            raise RuntimeError(f"{what}: a save is in flight ({self._what}); wait for it first")
        if self.pin and torch.cuda.is_available():
            torch.cuda.synchronize()  # the staged copies are complete before the thread reads them
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(job())
            except BaseException as error:  # noqa: BLE001 (DCP's CheckpointException included)
                future.set_exception(error)

        # A daemon thread: a job that dies (an error on the training thread, a lost peer) is not
        # kept alive by a write stuck in a collective; its temporary folder is removed at the
        # next start, and the states already published stay.
        threading.Thread(target=run, name=f"save {what}", daemon=True).start()
        self._future, self._what = future, what

    def wait(self) -> str | None:
        """Wait for the write in flight; return what it wrote (None if none was in flight).
        Its error, if any, is raised here."""
        future, what = self._future, self._what
        if future is None:
            return None
        self._future, self._what = None, None
        future.result()
        return what


def decide_for_run(args, model, optimizer, runtime: Runtime) -> AsyncSave:
    """`--async-save`, `--no-async-save`, or the default measured (`async_save_options.decide`):
    this rank's staged copy (its shards of the weights and optimizer moments, the moments a
    first step will create included) times the ranks of its node, and the node's MemAvailable;
    every rank gets the fullest node's copy and the smallest node's memory (one collective), so
    every rank decides alike. After the model, optimizer and resumed state are in place."""
    if args.async_save is not None:
        return decide(args.async_save, args.optimizer, 0, None)
    per_rank = staged_bytes(model.state_dict()) + optimizer_bytes(args, optimizer)
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    available = node_available_memory()
    per_node, fewest, unknown = all_reduce_max(
        [per_rank * local_ranks, -(available or 0), float(available is None)], runtime
    )
    return decide(None, args.optimizer, int(per_node), None if unknown else int(-fewest))


def optimizer_bytes(args, optimizer) -> int:
    """This rank's optimizer state as a save holds it: the state there is, and for parameters
    without one yet (before the first step) the state their first step creates."""
    held, fresh = 0, []
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param)
            if state:
                held += staged_bytes(dict(state))
            else:
                local = param.to_local() if isinstance(param, DTensor) else param
                fresh.append(torch.empty(local.shape, dtype=local.dtype, device="meta"))
    return held + first_state_bytes(args, fresh)


def node_available_memory() -> int | None:
    """The node's MemAvailable in bytes, or None where it is not known; less where this job's
    memory cgroup (a Slurm job's `--mem`, a container's limit) leaves less room."""
    try:
        with open(MEMINFO) as handle:
            available = mem_available(handle.read())
    except OSError:
        return None
    try:
        with open(PROC_CGROUP) as handle:
            room = cgroup_room(Path(CGROUP_ROOT), handle.read())
    except OSError:
        room = None
    if available is None or room is None:
        return available
    return min(available, room)


def cgroup_room(root: Path, proc_cgroup: str) -> int | None:
    """The least room (limit less usage) of this process's memory cgroups and their ancestors,
    from the text of /proc/self/cgroup and the hierarchy under `root` (v2: `memory.max`,
    `memory.current`; v1: `memory/` with `memory.limit_in_bytes`, `memory.usage_in_bytes`);
    None where no limit is set or readable."""
    rooms = []
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base, (limit_file, usage_file) = root, CGROUP_FILES["v2"]
        elif "memory" in controllers.split(","):
            base, (limit_file, usage_file) = root / "memory", CGROUP_FILES["v1"]
        else:
            continue
        folder = base / path.strip("/")
        while True:
            try:
                limit = (folder / limit_file).read_text().strip()
                usage = int((folder / usage_file).read_text())
            except (OSError, ValueError):
                limit = "max"
            if limit != "max" and int(limit) < NO_LIMIT:
                rooms.append(max(int(limit) - usage, 0))
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(rooms) if rooms else None
