"""The measured side of the plan: peak live tensor bytes of a real training run, on any device.

With `MINI_TRAINER_MEMORY_PROBE=PREFIX` set, the training loop runs its steps inside torch's
`MemTracker` (torch.distributed._tools), a TorchDispatchMode that sees every tensor an
operator creates (FSDP2's all-gather and reduce-scatter buffers too), plus the parameter
shards and optimizer states that exist before it starts, and frees them when
their storage dies. Each rank writes its peak and the breakdown at that peak to
`PREFIX.rank<R>.json`. On the CPU this is the only exact measure of tensor memory (the process
RSS also counts the allocator, libraries and the Python heap), and it is the accounting the plan
predicts (benchmarks/plan.py compares the two). Unset, the probe does nothing and costs nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV = "MINI_TRAINER_MEMORY_PROBE"


class MemoryProbe:
    """Started once the model and optimizer exist; `close()` when the steps end."""

    def __init__(self, model, optimizer, rank: int):
        self._prefix = os.environ.get(ENV)
        self._tracker = None
        self._rank = rank
        if not self._prefix:
            return
        self._tracker = _tracker_class()()
        self._tracker.track_external(model, optimizer)
        # The tracker refuses a module run twice unless its per-module stats are cleared; the
        # peak it keeps is global and survives the reset.
        optimizer.register_step_post_hook(lambda *_: self._reset())
        self._tracker.__enter__()

    def _reset(self) -> None:
        if self._tracker is not None:
            self._tracker.reset_mod_stats()

    def close(self) -> None:
        if self._tracker is None:
            return
        tracker, self._tracker = self._tracker, None
        tracker.__exit__(None, None, None)
        snapshot = tracker.get_tracker_snapshot("peak")
        out = {
            str(device): {str(kind): int(value) for kind, value in kinds.items()}
            for device, kinds in snapshot.items()
        }
        path = Path(f"{self._prefix}.rank{self._rank}.json")
        path.write_text(json.dumps(out, indent=2) + "\n")


class _NoHook:
    def remove(self) -> None:
        pass


def _tracker_class():
    """torch's MemTracker, except that it leaves frozen parameters (OSFT) without the gradient
    hook it installs on every parameter a module uses (torch refuses a hook there)."""
    # deferred: torch's MemTracker, only when MINI_TRAINER_MEMORY_PROBE is set
    from torch.distributed._tools.mem_tracker import MemTracker

    class Tracker(MemTracker):
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            for param in module.parameters():
                if not param.requires_grad and param not in self._param_to_grad_hook_handles:
                    self._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

    return Tracker


def memory_probe(model, optimizer, rank: int) -> MemoryProbe:
    return MemoryProbe(model, optimizer, rank)
