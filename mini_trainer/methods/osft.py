"""OSFT's options (the method itself is `mini_trainer/osft/method.py`).

`--osft` is the seed's spelling of `--method osft` and stays: either selects OSFT, and
`TrainingArgs` keeps the two in step. OSFT's options are in the fingerprint of every run, as
they were before methods had names, so every saved state resumes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mini_trainer.methods.options import MethodOptions, flag, option

OSFT_RANK_MODES = ("uniform", "adaptive")


@dataclass
class OSFTOptions(MethodOptions):
    """Orthogonal Subspace Fine-Tuning's options (docs/osft.md)."""

    name = "osft"
    label = "OSFT"
    implementation = "mini_trainer.osft.method:OSFT"
    needs = "--osft"
    legacy_fingerprint = True
    """Every run's fingerprint holds these options (states saved before `--method` have them)."""

    osft: bool = option(
        False,
        "Orthogonal Subspace Fine-Tuning: each targeted weight trains only outside its top "
        "singular subspace (docs/osft.md); the same as --method osft.",
    )
    osft_unfreeze_rank_ratio: float | None = option(
        None,
        "OSFT: share of each targeted weight's rank that trains, 0.0 (none: the weight is "
        "frozen) to 1.0 (all: plain training); required with --osft in uniform rank mode, "
        "ignored in adaptive mode.",
        minimum=0,
        maximum=1,
    )
    osft_target_patterns: list[str] | None = option(
        None,
        "OSFT: substrings of parameter names to factorize (default: the q/k/v/o and "
        "gate/up/down projections, or the model family's names for them).",
        nargs="+",
    )
    osft_svd_cache: str | None = option(
        None,
        "OSFT: folder written by `mini-trainer osft-svd` (checked, then used instead of "
        "computing the SVD).",
    )
    osft_freeze_non_targets: bool = option(
        False, "OSFT: also freeze what is not targeted (embeddings, norms, LM head, biases)."
    )
    osft_rank_mode: str = option(
        "uniform",
        f"OSFT: {' or '.join(OSFT_RANK_MODES)}; adaptive freezes more of the layers whose "
        "output is most similar to their input.",
        choices=OSFT_RANK_MODES,
    )
    osft_min_frozen_ratio: float = option(
        0.1,
        "OSFT adaptive: frozen share of the least similar layer (importance 0).",
        minimum=0,
        maximum=1,
    )
    osft_max_frozen_ratio: float = option(
        0.8,
        "OSFT adaptive: frozen share of a layer whose output equals its input.",
        minimum=0,
        maximum=1,
    )

    @classmethod
    def method_problems(cls, args, selected: bool) -> Iterator[str]:
        if args.osft_rank_mode not in OSFT_RANK_MODES:
            yield (
                f"--osft-rank-mode: unknown value {args.osft_rank_mode!r} "
                f"(one of {', '.join(OSFT_RANK_MODES)})"
            )
        for name in ("osft_unfreeze_rank_ratio", "osft_min_frozen_ratio", "osft_max_frozen_ratio"):
            value = getattr(args, name)
            if value is not None and not 0.0 <= value <= 1.0:
                yield f"--{flag(name)}: must be in [0, 1], got {value}"
        given = [name for name in cls.given(args) if name != "osft"]
        if not selected:
            for name in given:
                yield f"--{flag(name)}: needs --osft"
            return
        adaptive = args.osft_rank_mode == "adaptive"
        if not adaptive and args.osft_unfreeze_rank_ratio is None:
            yield "--osft-unfreeze-rank-ratio: required with --osft"
        if not adaptive:
            for name in ("osft_min_frozen_ratio", "osft_max_frozen_ratio"):
                if name in given:
                    yield f"--{flag(name)}: needs --osft-rank-mode adaptive"
        if args.osft_min_frozen_ratio > args.osft_max_frozen_ratio:
            yield (
                f"--osft-min-frozen-ratio: {args.osft_min_frozen_ratio} is above "
                f"--osft-max-frozen-ratio {args.osft_max_frozen_ratio}"
            )
        if args.osft_freeze_non_targets and args.osft_unfreeze_rank_ratio == 0.0:
            yield (
                "--osft-freeze-non-targets: with --osft-unfreeze-rank-ratio 0.0 nothing would train"
            )
        if args.osft_target_patterns is not None and not all(args.osft_target_patterns):
            yield "--osft-target-patterns: empty pattern"

    @classmethod
    def fingerprint_terms(cls, args) -> dict[str, Any]:
        """Nothing beyond the legacy terms: `osft: true` names the method."""
        return {}

    @classmethod
    def plan_terms(cls, args) -> dict[str, Any]:
        """The rank mode (the plan's `training` always has `osft` and the ratio)."""
        return {"osft_rank_mode": args.osft_rank_mode}
