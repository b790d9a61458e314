"""Elastic Weight Consolidation (EWC, online form) as a training method.

- `fisher`: the `ewc-fisher` folder: the diagonal Fisher of a stage's data at that stage's final
  weights, accumulated over stages, written once per stage with its checksums; read back and
  checked.
- `method`: the EWC `TrainingMethod`: the penalty's gradient added to every parameter shard
  before the clip, its value logged.
"""
