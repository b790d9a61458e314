"""The lean-state options' names and rules: `--optimizer` and `--param-dtype`.

One place decides which modes exist and which combinations are refused (one line each), so the
CLI, `run_training()`, the pipeline's config check and `plan` agree. Kept apart from
training/optimizer.py (which builds the optimizers, with torch and torchao) so that reading the
options imports nothing heavy.

Modes (docs/training.md, "Optimizer state and parameter dtype"):
- `adamw`: torch's AdamW, fp32 states: today's numerics, bit for bit (the default);
- `adamw-bf16`: AdamW with both moments kept in bf16 (`lean_adamw.rounds_to_nearest`);
- `adamw-8bit`: torchao's AdamW8bit, moments block-quantized to 8 bits (blocks of 256);
- `adamw-4bit`: refused (see `REFUSED_OPTIMIZERS`).
`--param-dtype bf16` keeps the sharded master weights and their gradients in bf16; each update
is applied with stochastic rounding, so that updates smaller than bf16's spacing are not lost.
It sets how the weights are stored, not how a step computes (`bf16_compute`).
"""

from __future__ import annotations

OPTIMIZERS = ("adamw", "adamw-bf16", "adamw-8bit")
"""`--optimizer` values (the config schema's enum is generated from them)."""
PARAM_DTYPES = ("fp32", "bf16")
"""`--param-dtype` values: the dtype of the sharded master weights and their gradients."""

REFUSED_OPTIMIZERS = {
    "adamw-4bit": (
        "torchao 0.18's AdamW4bit crashes the process (a segmentation fault in its compiled "
        "step on the CPU, torch 2.13) although it runs under FSDP2; use adamw-8bit"
    ),
}
"""Values refused with their reason rather than as unknown (docs/training.md says what was
tried)."""

WORLD_SIZE_BOUND = ("adamw-8bit",)
"""Modes whose saved state is laid out per rank's shard (torchao quantizes blocks of the local
shard, and keeps fp32 state for a shard under 4,096 elements): a state resumes only on the world
size that saved it (`state_layout`, compared by `layout_differences`)."""


def bf16_compute(cuda: bool) -> bool:
    """Whether forward and backward compute in bf16: on CUDA (FSDP2's mixed precision, fp32
    gradient reduction), whatever `--param-dtype`; never on the CPU, where bf16 weights are
    gathered as fp32. So on the CPU `--param-dtype bf16` changes what it changes on a GPU, the
    stored weights and gradients, and not the arithmetic of the step (docs/training.md)."""
    return cuda


def optimizer_problems(args) -> list[str]:
    """Rule violations of `--optimizer` / `--param-dtype` with the other options (one line each)."""
    problems = []
    if args.optimizer in REFUSED_OPTIMIZERS:
        problems.append(f"--optimizer {args.optimizer}: {REFUSED_OPTIMIZERS[args.optimizer]}")
    elif args.optimizer not in OPTIMIZERS:
        problems.append(
            f"--optimizer: unknown value {args.optimizer!r} (one of {', '.join(OPTIMIZERS)})"
        )
    if args.param_dtype not in PARAM_DTYPES:
        problems.append(
            f"--param-dtype: unknown value {args.param_dtype!r} (one of {', '.join(PARAM_DTYPES)})"
        )
    elif args.param_dtype == "bf16" and args.osft:
        problems.append(
            "--param-dtype bf16: not with --osft (OSFT keeps its updates out of the frozen "
            "subspace to fp32 rounding; bf16 factors would leak into it); use --param-dtype fp32 "
            "with any --optimizer"
        )
    return problems


def state_layout(args, world_size: int) -> dict:
    """What a saved optimizer state's layout depends on beyond the options: the world size, for
    the modes in `WORLD_SIZE_BOUND` (empty for the others: any world size resumes them)."""
    if args.optimizer in WORLD_SIZE_BOUND:
        return {"optimizer": args.optimizer, "world_size": world_size}
    return {}


def layout_differences(saved: dict | None, current: dict) -> list[str]:
    """One line if a state's layout (`state_layout`) cannot be resumed by this run."""
    saved = saved or {}
    if not current or saved.get("world_size") in (None, current["world_size"]):
        return []
    return [
        f"--optimizer {current['optimizer']}: the state was saved by {saved['world_size']} "
        f"ranks, this run has {current['world_size']} (its 8-bit state is quantized per rank's "
        "shard, so it resumes only on the same number of ranks)"
    ]
