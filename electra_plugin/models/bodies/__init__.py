"""Encoder bodies (``--encoder-body``): one kind per file; :class:`.base.EncoderBody` is what
the model calls to build its embeddings and encoders."""

from typing import Tuple, Type

from ..core.config import marked_discriminator_options
from .base import (BODIES, EncoderBody, body_named, full_width_generator,  # noqa: F401
                   register_body)
from . import bert, deberta, modern  # noqa: F401,E402


def body_of(cfg) -> Type[EncoderBody]:
    """The body a model config builds (``--encoder-body``; unset: BERT's, as the archs and
    checkpoints from before the option have it)."""
    return body_named(cfg.get("encoder_body", None) or "bert")


def discriminator_options(cfg) -> Tuple[str, ...]:
    """The options that build a discriminator like ``cfg``'s: the config's fields marked
    ``shapes_discriminator`` (sizes, positions, token types, the body), then the options its
    body reads. Trials, the HF import and the checkpoint checks read them here."""
    marked = marked_discriminator_options()
    return marked + tuple(o for o in body_of(cfg).options if o not in marked)
