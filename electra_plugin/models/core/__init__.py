"""What every ELECTRA model is built from and stored as: its options and sizes, the encoder,
the heads, the FLOPs count, dtype-fixed buffers, and the checkpoint file format."""
