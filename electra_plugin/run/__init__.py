"""The training run's safety machinery: crash-safe checkpoints (and resume past a damaged
one), divergence stops, one run per --save-dir, and checks of the binarized data."""
