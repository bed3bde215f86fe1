"""Tools that measure what the training step asks of the host (benchmarks and tests)."""
