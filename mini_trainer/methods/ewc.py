"""EWC's options (the method itself is `mini_trainer/ewc/method.py`).

Elastic Weight Consolidation (Kirkpatrick et al. 2017), online form (Schwarz et al. 2018): the
loss gains `lambda/2 * sum_i F_i (theta_i - theta*_i)^2`, with F the diagonal Fisher and theta*
the weights of the previous stage, both read from a folder that `mini-trainer ewc-fisher`
wrote (docs/training.md). Without `--ewc-fisher` (stage 1: nothing to protect yet) the penalty
is 0 and the run is SFT.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mini_trainer.errors import UserError
from mini_trainer.methods.options import MethodOptions, option

FISHER_META = "meta.json"
"""The `ewc-fisher` folder's record: estimator, gamma, stages, files and their checksum."""


@dataclass
class EWCOptions(MethodOptions):
    """Elastic Weight Consolidation's options."""

    name = "ewc"
    label = "EWC"
    implementation = "mini_trainer.ewc.method:EWC"

    ewc_lambda: float = option(
        1.0,
        "EWC: weight lambda of the penalty lambda/2 * sum F (theta - theta*)^2 (0: plain SFT).",
        minimum=0,
    )
    ewc_fisher: str | None = option(
        None,
        "EWC: folder written by `mini-trainer ewc-fisher` (the diagonal Fisher and the weights "
        "it was taken at); without it (a first stage) the penalty is 0.",
    )

    @classmethod
    def method_problems(cls, args, selected: bool) -> Iterator[str]:
        yield from super().method_problems(args, selected)
        if not (args.ewc_lambda >= 0 and args.ewc_lambda != float("inf")):
            yield f"--ewc-lambda: must be a finite number >= 0, got {args.ewc_lambda}"

    @classmethod
    def fingerprint_terms(cls, args) -> dict[str, Any]:
        """The name, lambda, and the Fisher folder's checksum (not its path)."""
        terms: dict[str, Any] = {"method": cls.name, "ewc_lambda": args.ewc_lambda}
        if args.ewc_fisher is not None:
            path = Path(args.ewc_fisher) / FISHER_META
            try:
                terms["ewc_fisher"] = json.loads(path.read_text()).get("checksum")
            except (OSError, ValueError, AttributeError) as error:
                raise UserError(
                    f"--ewc-fisher: {path}: not an ewc-fisher record ({error})"
                ) from None
        return terms

    @classmethod
    def may_change_on_resume(cls) -> tuple[str, ...]:
        return ("ewc_fisher",)

    @classmethod
    def plan_terms(cls, args) -> dict[str, Any]:
        return {"ewc_lambda": args.ewc_lambda, "ewc_fisher": args.ewc_fisher}
