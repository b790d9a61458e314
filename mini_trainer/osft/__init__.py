"""Orthogonal Subspace Fine-Tuning (OSFT, arXiv:2504.07097).

For each targeted weight W = U S Vᵀ, the top-k singular directions (what the model relies on)
are frozen and the update is confined to their orthogonal complement. Modules, one concern each:

- `targets`: which linear weights are factorized (default names per model family, patterns).
- `svd`: the fp32 thin SVD and the split into frozen (high) and trainable (low) factors.
- `cache`: the `osft-svd` folder (factors + meta.json), its content hash and its checks.
- `linear`: the factorized linear layer that replaces a target during training.
- `projection`: keeping the trainable factors orthogonal to the frozen ones under FSDP2.
- `adaptive`: the paper's per-layer ranks from input/output hidden-state similarity.
- `method`: the OSFT `TrainingMethod` that plugs all of this into the training loop's hooks.
"""
