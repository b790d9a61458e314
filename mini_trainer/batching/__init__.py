"""From a dataset to per-rank packed micro-batches (see docs/batching.md).

- `sampler`: global batches per optimizer step (seeded permutation per epoch) and training modes.
- `packing`: `plan_micro_batches`, the numba LPT planner splitting a batch across ranks.
- `collator`: the step plan in dataset indices and the padding-free packed row per rank.

Nothing is imported here, so tools that only need the planner do not pay for torch.
"""
