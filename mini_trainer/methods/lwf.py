"""LwF's options (the method itself is `mini_trainer/training/lwf.py`).

Learning without Forgetting (Li and Hoiem 2017) as self-distillation: the stage's starting
weights (the previous stage's final/, `--model-name-or-path`) are a frozen teacher, and the loss
gains `weight * T^2 * KL(teacher_T || student_T)` over the current stage's loss tokens, at
temperature T, the teacher's distribution kept to its top-k tokens per position.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from mini_trainer.methods.options import MethodOptions, option


@dataclass
class LwFOptions(MethodOptions):
    """Learning without Forgetting (self-distillation from the stage's start)."""

    name = "lwf"
    label = "LwF"
    implementation = "mini_trainer.training.lwf:LwF"

    lwf_weight: float = option(
        1.0, "LwF: weight of the distillation term weight * T^2 * KL (0: plain SFT).", minimum=0
    )
    lwf_temperature: float = option(
        2.0, "LwF: softmax temperature T of teacher and student.", exclusive_minimum=0
    )
    lwf_top_k: int = option(
        64,
        "LwF: teacher tokens kept per position (its probabilities exact, the rest of its mass one "
        "bucket of the KL); at least the vocabulary size: the exact KL.",
        minimum=1,
    )

    @classmethod
    def method_problems(cls, args, selected: bool) -> Iterator[str]:
        yield from super().method_problems(args, selected)
        if not (args.lwf_weight >= 0 and math.isfinite(args.lwf_weight)):
            yield f"--lwf-weight: must be a finite number >= 0, got {args.lwf_weight}"
        if not (args.lwf_temperature > 0 and math.isfinite(args.lwf_temperature)):
            yield f"--lwf-temperature: must be a finite number > 0, got {args.lwf_temperature}"
        if args.lwf_top_k < 1:
            yield f"--lwf-top-k: must be at least 1, got {args.lwf_top_k}"

    @classmethod
    def plan_terms(cls, args) -> dict:
        return {"lwf_weight": args.lwf_weight, "lwf_temperature": args.lwf_temperature}
