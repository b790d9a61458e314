"""The job's processes: process group and device (`runtime`), launching and supervising the
workers (`launcher`, `slurm`), the output folder's lock (`run_lock`), stop signals
(`preemption`), worker lifetime (`lifetime`), retries across restarts (`retry`) and the rank
read from the environment without torch (`env`).

Imports run one way: training, models, OSFT and evaluation import this package, and it imports
none of them (tests/test_imports.py). `slurm` reads the training flags through
`training_args`, which imports nothing of the training package.
"""
