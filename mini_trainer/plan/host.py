"""Per node: host memory of the phases that run on the CPU side, and disk. All formulas over
the counted model (the code holds these buffers; the plan states their sizes)."""

from __future__ import annotations

from mini_trainer.plan.model import Counts

EXPORT_BLOCK_BYTES = 4 << 24
"""models/export.py casts and writes WRITE_BLOCK (2^24) elements at a time, from fp32."""
SVD_PART_BYTES = 1024**3
"""osft/build.py: a rank starts a new factor file after this many bytes."""


def host_and_disk(
    counts: Counts, gpus_per_node: int, cpu_offload: bool, osft: bool, save_bytes: int
) -> tuple[list[dict], list[dict]]:
    """(host lines per node, disk lines); each {name, bytes, note}."""
    shard = counts.shard_params * 4
    trainable = counts.shard_trainable * 4
    largest = counts.largest_param * 4
    host = []
    if cpu_offload:
        host.append(
            {
                "name": "CPU offload: shards, gradients, optimizer states",
                "bytes": gpus_per_node * (shard + 3 * trainable),
                "note": "every GPU's fp32 shards live in host memory",
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
            "bytes": counts.total_params * 4 + 2 * counts.trainable_params * 4,
            "note": "fp32 weights and AdamW states of the whole model, all ranks together",
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
