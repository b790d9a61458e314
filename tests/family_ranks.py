"""Run under torchrun (2 ranks): every family's step on rank-split packed rows, against
transformers' eager per-sample reference of the whole batch. Rank 0 writes
{family: [loss relative error, [(worst tensor, its relative error), ...]]} to ARGV[1].

`python -m torch.distributed.run --standalone --nproc-per-node 2 tests/family_ranks.py OUT DIR
[FAMILY ...]`: the models are saved under DIR (rank 0), one folder per family.
"""

from __future__ import annotations

# Kept alike on purpose: the `families` import below names what test_families.py imports.
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from families import (
    FAMILIES,
    build_model,
    eager_reference,
    full_grads,
    relative_error,
    samples,
    sharded_step,
    worst_errors,
)

from mini_trainer.distributed.runtime import init_runtime


def main(out: str, work: str, names: list[str]) -> None:
    runtime = init_runtime()
    results = {}
    for name in names or [family.name for family in FAMILIES]:
        model = build_model(name)
        folder = Path(work) / name
        if runtime.is_main:
            model.save_pretrained(folder)
        dist.barrier()
        batch = samples(model.config.vocab_size)
        want_loss, want_grads = eager_reference(model, batch)
        # Rank r packs samples r, r + 2, ...: every rank holds samples longer than the windows.
        wrapped, loss = sharded_step(folder, batch[runtime.rank :: runtime.world_size], runtime)
        dist.all_reduce(loss)
        got = full_grads(wrapped, runtime.world_size)
        results[name] = [relative_error(loss, want_loss), worst_errors(got, want_grads)]
        del wrapped
    if runtime.is_main:
        Path(out).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
