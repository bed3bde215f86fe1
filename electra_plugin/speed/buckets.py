"""Fine-tuning batches at a few lengths (``--length-buckets N``): the encoder's input padded
on the right to the next of N lengths spread evenly up to the longest the model takes, so
that a compiled or CUDA-graphed encoder meets at most N shapes however the data's lengths
vary (pre-training gets its few shapes from the collater: ``length_bucket`` in the electra
task). Padding is masked, and positions and relative distances of the real tokens do not
move, so the outputs at the batch's own positions are the unpadded batch's (within float
rounding; tests/test_length_buckets.py). Part of :mod:`electra_plugin.speed`: off with
``ELECTRA_SPEED=0`` or ``-buckets``."""

import math

import torch.nn.functional as F

from .switch import enabled


def bucket_length(length: int, longest: int, buckets: int) -> int:
    """The smallest of ``buckets`` lengths evenly spaced up to ``longest`` that holds
    ``length`` (``length`` itself beyond ``longest``, which the model then refuses)."""
    if buckets <= 0 or length >= longest:
        return length
    step = math.ceil(longest / buckets)
    return min(longest, math.ceil(length / step) * step)


def pad_to_bucket(tokens, token_types, padding_idx: int, longest: int, buckets: int):
    """-> B x T tokens and token types (or None) padded on the right to
    :func:`bucket_length` (``padding_idx`` and type 0), and ``has_padding`` for the batch's
    layout: True when bucketing, so that every batch takes the padded layout (an attention
    mask) and no host sync asks the mask whether it holds padding; None (ask) when off."""
    if buckets <= 0 or not enabled("buckets"):
        return tokens, token_types, None
    length = tokens.size(1)
    extra = bucket_length(length, longest, buckets) - length
    if extra:
        tokens = F.pad(tokens, (0, extra), value=padding_idx)
        token_types = None if token_types is None else F.pad(token_types, (0, extra), value=0)
    return tokens, token_types, True
