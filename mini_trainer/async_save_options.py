"""Whether a run writes its training states in the background (`--async-save`): one rule.

`--async-save` forces it on, `--no-async-save` off; without either (the default) it is on where
it is safe, decided here from numbers each rank measures at the start of training (the loop
gathers them, so every rank decides alike) and that `plan` counts:

- the staged copy must fit: the host copy of one state that every rank of the node holds for the
  background write (each rank's shards of the weights and optimizer moments; pinned host memory
  on CUDA; on the CPU a second copy of what training holds) may take at most
  `HOST_MEMORY_SHARE` of the node's available host memory (`MemAvailable` of /proc/meminfo, or
  the room the job's memory cgroup leaves where that is less) at the start of training. The
  other half is the margin: the optimizer moments that appear at the first step (on the CPU
  they come from the same memory, and are at most the copy's size), the page cache of the
  writes, the data loader and the final export;
- the optimizer's state must be stageable (`UNSTAGEABLE_OPTIMIZERS`; today none: torchao's 8-bit
  moments are staged by their inner tensors).

No torch here: `plan` and the flag checks use it without starting anything.
"""

from __future__ import annotations

from dataclasses import dataclass

HOST_MEMORY_SHARE = 0.5
"""The largest share of the node's available host memory the staged copy may take by default."""

UNSTAGEABLE_OPTIMIZERS: dict[str, str] = {}
"""`--optimizer` modes whose state cannot be copied to host memory, with the reason: the default
is off for them and an explicit `--async-save` is refused."""

GIB = 1024**3


@dataclass(frozen=True)
class AsyncSave:
    """The decision and its reason, one line for the start of training."""

    on: bool
    """States are written in the background."""
    reason: str
    """Why, in words (printed by rank 0 at the start of training)."""

    def __post_init__(self):
        if not self.reason:
            raise ValueError("AsyncSave: a decision needs its reason")

    @property
    def line(self) -> str:
        return f"async save: {'on' if self.on else 'off'} ({self.reason})"


def refusal(optimizer: str) -> str | None:
    """Why `optimizer`'s state cannot be staged, or None."""
    return UNSTAGEABLE_OPTIMIZERS.get(optimizer)


def problems(args) -> list[str]:
    """An explicit `--async-save` that cannot work (one line each)."""
    reason = refusal(args.optimizer)
    if args.async_save is True and reason:
        return [f"--async-save: not with --optimizer {args.optimizer} ({reason}); save "
                "synchronously"]  # fmt: skip
    return []


def decide(
    requested: bool | None, optimizer: str, staged_per_node: int, available_per_node: int | None
) -> AsyncSave:
    """On or off, and why. `requested`: `--async-save` (True), `--no-async-save` (False) or
    neither (None: the default); `staged_per_node`: bytes of the host copy of one state that
    the node's ranks hold together; `available_per_node`: the node's available host memory at
    the start (None: not known, the default is then off). With several nodes, the fullest node's
    copy and the smallest node's memory."""
    if requested is True:
        return AsyncSave(True, "--async-save")
    if requested is False:
        return AsyncSave(False, "--no-async-save")
    reason = refusal(optimizer)
    if reason:
        return AsyncSave(False, f"default: --optimizer {optimizer}: {reason}")
    copy = f"the staged copy, {_gib(staged_per_node)} per node"
    if available_per_node is None:
        return AsyncSave(False, f"default: the node's available host memory is not known "
                                f"(no MemAvailable in /proc/meminfo); {copy}")  # fmt: skip
    limit = int(available_per_node * HOST_MEMORY_SHARE)
    if staged_per_node > limit:
        return AsyncSave(False, f"default: {copy}, is more than {HOST_MEMORY_SHARE:.0%} of the "
                                f"node's available host memory ({_gib(available_per_node)}); "
                                "--async-save forces it on")  # fmt: skip
    return AsyncSave(True, f"default: {copy}, fits in {HOST_MEMORY_SHARE:.0%} of the node's "
                           f"available host memory ({_gib(available_per_node)}); "
                           "--no-async-save turns it off")  # fmt: skip


def mem_available(meminfo: str) -> int | None:
    """Bytes of `MemAvailable` in the text of /proc/meminfo, or None."""
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            number, *unit = value.split()
            return int(number) * (1024 if unit == ["kB"] else 1)
    return None


def _gib(value: int) -> str:
    """A size for people: GiB, else MiB, else KiB, two decimals."""
    for unit, scale in (("GiB", GIB), ("MiB", 1024**2)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value / 1024:.2f} KiB"
