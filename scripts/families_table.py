"""Print (or, with --write, put into docs/training.md) the supported-families table, generated
from the family tests' own list (tests/families.py): each family's transformers class, what it
exercises, what its attention needs and the kernel each device takes for it.

    .venv/bin/python scripts/families_table.py [--write]

tests/test_families.py fails when docs/training.md's table differs from this output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from families import FAMILIES  # noqa: E402

from mini_trainer.models.moe import active_fraction  # noqa: E402
from mini_trainer.training import attention  # noqa: E402

DOC = ROOT / "docs" / "training.md"
BEGIN = "<!-- families-table: begin (scripts/families_table.py --write) -->"
END = "<!-- families-table: end -->"
KERNEL = {attention.FLASH_NAME: "flash-attn 2", attention.VARLEN_NAME: "torch varlen",
          attention.PER_SAMPLE_NAME: "per-sample"}  # fmt: skip


def table() -> str:
    rows = [
        "| family (`model_type`) | class | exercises | attention needs | CUDA kernel (with "
        "flash-attn / without) | experts per token |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for family in FAMILIES:
        config = family.build()
        config._attn_implementation = "eager"
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        needs = attention.attention_needs(model)
        with_flash = KERNEL[attention.choose_attention(True, True, True, needs)]
        without = KERNEL[attention.choose_attention(True, False, True, needs)]
        fraction = active_fraction(model)
        experts = (
            "dense"
            if fraction == 1.0
            else f"{config.num_experts_per_tok} of "
            + str(round(config.num_experts_per_tok / fraction))
        )
        rows.append(
            f"| {family.name} | `{type(model).__name__}` | {family.exercises} | "
            f"{', '.join(sorted(needs)) or '-'} | {with_flash} / {without} | {experts} |"
        )
    return "\n".join(rows)


def with_table(text: str, generated: str) -> str:
    """`text` with the block between the markers replaced by `generated`."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{generated}\n{END}{tail}"


if __name__ == "__main__":
    generated = table()
    if "--write" in sys.argv[1:]:
        DOC.write_text(with_table(DOC.read_text(), generated))
    else:
        print(generated)
