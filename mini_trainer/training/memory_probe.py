"""The measured side of the plan: peak live tensor bytes of a real training run, on any device.

With `MINI_TRAINER_MEMORY_PROBE=PREFIX` set, the training loop runs its steps inside torch's
`MemTracker` (torch.distributed._tools), a TorchDispatchMode that sees every tensor an
operator creates (FSDP2's all-gather and reduce-scatter buffers too), plus the parameter
shards and optimizer states that exist before it starts, and frees them when
their storage dies. Each rank writes its peak and the breakdown at that peak to
`PREFIX.rank<R>.json`. On the CPU this is the only exact measure of tensor memory (the process
RSS also counts the allocator, libraries and the Python heap), and it is the accounting the plan
predicts (benchmarks/plan.py compares the two). Unset, the probe does nothing and costs nothing.

torchao's compiled 8-bit update refuses to run under a dispatch mode, so its step runs with the
tracker set aside, and its temporaries are measured by the process's resident high-water mark
over the step (`/proc/self/clear_refs`, then `VmHWM`), added to what the tracker holds when the
step starts. That is exact for tensors when every large allocation is its own mapping (the
benchmark sets `MALLOC_MMAP_THRESHOLD_`); the first step, which compiles, is not counted.
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
        self._steps, self._step_peak = 0, None
        if _compiled_step(optimizer):
            optimizer.step = self._step_beside_tracker(optimizer.step)
        self._tracker.__enter__()

    def _step_beside_tracker(self, step):
        """`step` run with the tracker set aside, its temporaries measured by resident memory."""
        # deferred: torch's dispatch-mode switch, only when the probe is on
        from torch.utils._python_dispatch import _disable_current_modes

        def run(*args, **kwargs):
            live = self._tracker.get_tracker_snapshot("current") if self._tracker else None
            with _disable_current_modes():
                before = _resident_reset()
                result = step(*args, **kwargs)
                extra = max(0, _resident_peak() - before)
            self._steps += 1
            if live is not None and self._steps > 1:  # the first step compiles
                for device, kinds in live.items():
                    total = kinds[_TOTAL] + extra
                    if self._step_peak is None or total > self._step_peak[1]:
                        self._step_peak = (str(device), total, kinds, extra)
            return result

        return run

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
        if self._step_peak is not None:
            device, total, kinds, extra = self._step_peak
            if total > out.get(device, {}).get(_TOTAL, 0):
                out[device] = {str(kind): int(value) for kind, value in kinds.items()}
                out[device][_TOTAL] = int(total)
                out[device]["step temporaries (resident memory)"] = int(extra)
        path = Path(f"{self._prefix}.rank{self._rank}.json")
        path.write_text(json.dumps(out, indent=2) + "\n")


_TOTAL = "Total"  # the tracker's key for the sum of every kind


def _compiled_step(optimizer) -> bool:
    """torchao's 8-bit AdamW with its compiled update (not under TORCH_COMPILE_DISABLE=1)."""
    # deferred: torch and torchao, only when the probe is on
    import torch

    from mini_trainer.training.lowbit_adamw import AdamW8bit

    return isinstance(optimizer, AdamW8bit) and not torch._dynamo.config.disable


def _resident_reset() -> int:
    """Reset the process's resident high-water mark to its current size; that size in bytes."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_bytes("VmRSS:")


def _resident_peak() -> int:
    return _status_bytes("VmHWM:")


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


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
