"""Launching the training job's processes: torchrun from a cluster scheduler's environment."""
