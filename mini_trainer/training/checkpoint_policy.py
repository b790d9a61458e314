"""Which checkpoints are due after a step: a pure function of the counters and the flags.

- an export `hf_format/samples_<N>/` when `--min-samples-per-checkpoint` more samples were seen
  since the last export, or at the end of an epoch with `--checkpoint-at-epoch` (one export
  even when both hold);
- a state `state/step_<K>/` every `--save-every-steps` steps, and when a stop was requested
  (SIGTERM, SIGINT, SIGUSR1 on any rank), so the run can be resumed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Due:
    """What to write after a step, in this order: the exports, then the state."""

    exports: tuple[str, ...] = ()
    """Folder names under the output folder (`hf_format/samples_<N>`)."""
    state: bool = False


def checkpoints_due(
    args,
    *,
    step: int,
    samples_seen: int,
    samples_at_last_checkpoint: int,
    ends_epoch: bool,
    stop_requested: bool,
) -> Due:
    """What is due after optimizer step `step` (1-based), `samples_seen` samples in total."""
    every = args.min_samples_per_checkpoint
    by_samples = bool(every) and samples_seen - samples_at_last_checkpoint >= every
    export = by_samples or (args.checkpoint_at_epoch and ends_epoch)
    by_steps = bool(args.save_every_steps) and step % args.save_every_steps == 0
    return Due(
        exports=(f"hf_format/samples_{samples_seen}",) if export else (),
        state=by_steps or stop_requested,
    )
