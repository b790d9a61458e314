"""Training engine: the torchrun + FSDP2 job, its loss, checkpoints and logging."""
