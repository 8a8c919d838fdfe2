"""Training on one rank: the loop, the batch-size schedule, the optimizer, checkpoints."""
