"""Per node: host memory of the phases that run on the CPU side, and disk. All formulas over
the counted model (the code holds these buffers; the plan states their sizes)."""

from __future__ import annotations

from mini_trainer.async_save_options import HOST_MEMORY_SHARE, decide, refusal
from mini_trainer.plan.model import Counts

EXPORT_BLOCK_BYTES = 4 << 24
"""models/export.py casts and writes WRITE_BLOCK (2^24) elements at a time, from fp32."""
SVD_PART_BYTES = 1024**3
"""osft/build.py: a rank starts a new factor file after this many bytes."""


def host_and_disk(
    counts: Counts,
    gpus_per_node: int,
    cpu_offload: bool,
    osft: bool,
    save_bytes: int,
    param_bytes: int = 4,
    state_bytes: int | None = None,
    saved_states: int | None = None,
    async_save: bool | None = False,
    optimizer: str = "adamw",
    host_available: int | None = None,
) -> tuple[list[dict], list[dict]]:
    """(host lines per node, disk lines); each {name, bytes, note}. `param_bytes`: per element
    of the master weights and gradients; `state_bytes`: rank 0's optimizer state (None: fp32
    AdamW's); `saved_states`: a saved state's moments, all ranks (None: fp32 AdamW's);
    `async_save`: `--async-save` (True), `--no-async-save` (False) or the default (None), whose
    staged state in host memory (training/async_save.py) is counted where the default would turn
    it on: `host_available`, the node's host memory where the plan knows it (`--device cpu`),
    decides as training decides; unknown, it is counted, with the rule in its note."""
    largest = counts.largest_param * 4
    if state_bytes is None:
        state_bytes = 2 * counts.shard_trainable * 4
    host = []
    if cpu_offload:
        host.append(
            {
                "name": "CPU offload: shards, gradients, optimizer states",
                "bytes": gpus_per_node
                * ((counts.shard_params + counts.shard_trainable) * param_bytes + state_bytes),
                "note": "every GPU's shards live in host memory",
            }
        )
    staged = gpus_per_node * (counts.shard_params * param_bytes + state_bytes)
    held = staged_state_note(async_save, optimizer, staged, host_available)
    if held is not None:
        host.append(
            {
                "name": "async save: staged state",
                "bytes": staged,
                "note": "every rank's shard of weights and moments, copied (pinned) for the "
                f"background write; held while the run saves, each save writes into it; {held}",
            }
        )
    load = 2 * largest
    if osft:  # rank 0 splits each target: its SVD (U, S, V), W_high and the two bases
        load += 3 * largest
    host.append(
        {
            "name": "load (global rank 0)",
            "bytes": load,
            "note": "one tensor at a time: stored copy, fp32 copy"
            + (", its SVD split" if osft else ""),
        }
    )
    host.append(
        {
            "name": "export (global rank 0)",
            "bytes": 2 * largest + EXPORT_BLOCK_BYTES,
            "note": "one module gathered at a time, cast block by block",
        }
    )
    if osft:
        host.append(
            {
                "name": "SVD cache build (osft-svd)",
                "bytes": gpus_per_node * (SVD_PART_BYTES + 3 * largest),
                "note": "per rank: a factor file being filled, one weight and its SVD",
            }
        )
    disk = [
        {
            "name": "a training state (state/step_K)",
            "bytes": counts.total_params * param_bytes
            + (counts.trainable_params * 8 if saved_states is None else saved_states),
            "note": "weights and AdamW moments of the whole model, all ranks together",
        },
        {
            "name": "a Hugging Face checkpoint",
            "bytes": counts.dense_params * save_bytes,
            "note": "dense weights in --save-dtype",
        },
    ]
    if osft:
        disk.append(
            {
                "name": "the SVD cache",
                "bytes": counts.osft_svd_elements * 4,
                "note": "fp32 U, S, V of every target",
            }
        )
    return host, disk


def staged_state_note(
    requested: bool | None, optimizer: str, staged: int, available: int | None
) -> str | None:
    """Why the staged state of an async save is counted, or None where training would not
    hold it (`async_save_options.decide`, the rule training applies at its start)."""
    if requested is None and available is None and refusal(optimizer) is None:
        return (f"the default: on where it fits in {HOST_MEMORY_SHARE:.0%} of the node's "
                "available host memory at the start, else off and not held")  # fmt: skip
    decision = decide(requested, optimizer, staged, available)
    return decision.reason if decision.on else None
