"""Encoder bodies (``--encoder-body``): one kind per file; :class:`.base.EncoderBody` is what
the model calls to build its embeddings and encoders."""

from .base import BODIES, EncoderBody, body_named, register_body  # noqa: F401
from . import bert, deberta, modern  # noqa: F401,E402
