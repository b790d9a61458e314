"""Training engine: the torchrun + FSDP2 job, its loss, checkpoints and logging.

docs/architecture.md has one line per module. In the order a run meets them: `loop` (the
phases), `data_setup`, `model_setup`, `attention`, `packed_attention`, `loss`, `optimizer`,
`compile`, `prefetch`, `divergence`, `stopping`, `checkpoint_policy`, `checkpoint`,
`trainer_state`, `state_checksums`, `save_guard`, `run_folder`, `resume`, `fingerprint`,
`method` (the registry), `metrics`, `flops`, `validation`, `evaluator` and `eval_stats` (the
evaluator core `mini-trainer evaluate` shares), `memory_probe` (benchmarks/plan.py's measure).
Imports run downward only: nothing here imports `plan/`, `evaluate/`, `report/`, `pipeline/` or
`cli/` (tests/test_imports.py).
"""
