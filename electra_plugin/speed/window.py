"""Sliding-window attention at a cost linear in the length: each query sees only the keys a
window can reach, instead of the whole T x T score matrix with most of it masked away.

Part of :mod:`electra_plugin.speed`. The sequence is cut into blocks of ``window``
positions; a window of ``window`` keys on either side of a query in block i lies inside
blocks i-1, i and i+1, so block i scores its queries against those three blocks only
(``3 * window`` keys per query instead of T), and a mask keeps the keys within the window
that are real tokens. torch's ``flex_attention`` would skip the same blocks, but torch 2.13
has no backward for it on CPU; these are plain matmuls, forward and backward on any device.
With ``ELECTRA_SPEED=0`` (or ``ELECTRA_SPEED=-window``), or where the three blocks would
cover more than half the sequence, the local layers take the dense masked
``F.scaled_dot_product_attention``.
"""

from typing import Optional

import torch
import torch.nn.functional as F

from .dropout import dropout
from .switch import enabled


def keys_per_query(length: int, window: int) -> int:
    """The keys each query of a ``length``-token sequence is scored against by the local
    attention that runs (what the FLOPs count reads): three blocks of ``window``, or all
    of them where the blocks would be more than half the sequence (there the dense fused
    kernel is as fast on CPU: measured in docs/bodies.md, "Long context")."""
    keys = 3 * max(window, 1)
    return keys if 2 * keys <= length else length


def use_window_kernel(length: int, window: Optional[int]) -> bool:
    return window is not None and enabled("window") and keys_per_query(length, window) < length


def window_mask(real: Optional[torch.Tensor], length: int, window: int, device) -> torch.Tensor:
    """bool B (or 1) x 1 x blocks x window x 3*window "may attend" for :func:`window_attention`:
    keys within ``window`` positions of the query that are real tokens (``real``: bool
    B x T, True = token, or None when all are); every query attends to itself too, as the
    dense mask lets padded queries do, so that no row of scores is empty."""
    block = max(window, 1)
    blocks = -(-length // block)
    if real is None:
        real = torch.ones(1, length, dtype=torch.bool, device=device)
    # block i's keys: positions (i-1)*block .. (i+2)*block-1; False outside the sequence
    keys = F.pad(real, (block, block + blocks * block - length)).unfold(1, 3 * block, block)
    offset = (torch.arange(3 * block, device=device)[None, :] - block
              - torch.arange(block, device=device)[:, None])  # key minus query position
    mask = (offset.abs() <= window) & keys[:, :, None, :] | (offset == 0)
    return mask[:, None]


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     window: int, dropout_p: float) -> torch.Tensor:
    """Softmax attention of q over the keys within ``window`` positions (``mask`` from
    :func:`window_mask`); q, k, v: B x heads x T x d -> B x heads x T x d, as
    ``F.scaled_dot_product_attention`` with the dense window mask computes it."""
    B, heads, length, d = q.shape
    block = max(window, 1)
    blocks = -(-length // block)
    tail = blocks * block - length
    q = F.pad(q * d ** -0.5, (0, 0, 0, tail)).view(B, heads, blocks, block, d)
    # one block of zeros before and after: block i's neighbourhood is a 3-block view
    k, v = (F.pad(t, (0, 0, block, block + tail)).unfold(2, 3 * block, block)
            for t in (k, v))  # B x heads x blocks x d x 3*block
    scores = torch.matmul(q, k).masked_fill(~mask, float("-inf"))
    probs = dropout(scores.softmax(-1), dropout_p, training=dropout_p > 0)
    out = torch.matmul(probs, v.transpose(-1, -2))  # B x heads x blocks x block x d
    return out.flatten(2, 3)[:, :, :length]
