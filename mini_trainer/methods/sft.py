"""Plain supervised fine-tuning (full fine-tuning): every parameter trains. No options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mini_trainer.methods.options import MethodOptions


@dataclass
class SFTOptions(MethodOptions):
    """SFT has no options of its own."""

    name = "sft"
    label = "SFT"
    implementation = "mini_trainer.method:FullFineTuning"

    @classmethod
    def fingerprint_terms(cls, args) -> dict[str, Any]:
        """Nothing: the fingerprint of an SFT run is that of runs before methods had names."""
        return {}
