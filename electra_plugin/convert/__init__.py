"""Checkpoint conversion to and from other toolkits (``hf``: Hugging Face transformers)."""

from .hf import from_hf, to_hf  # noqa: F401
