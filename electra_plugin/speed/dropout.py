"""Dropout with a cheaper mask on CPU: 15 random bits per element from SplitMix64.

Part of :mod:`electra_plugin.speed`; with ``ELECTRA_SPEED=0`` it is ``F.dropout``.
"""

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..splitmix import splitmix64
from .switch import enabled


class Dropout(nn.Dropout):
    """``nn.Dropout`` with a cheaper mask on CPU (same module name, no parameters).

    ``F.dropout`` on CPU draws a float Bernoulli sample per element (~6 ns each, the largest
    cost of the step after the matmuls) and keeps that float mask for the backward pass.
    Here each element gets 15 random bits (16-bit lanes of :func:`random_int16`), is kept
    with probability ``round((1 - p) * 2**15) / 2**15`` and the kept values are scaled by
    the inverse of that probability, so the output's expectation is the input exactly. The
    mask is built with integer arithmetic, kept in one byte per element and turned into
    the scaled mask by a bit-and with the scale's bit pattern: comparisons, bool masks and
    int-to-float conversions take slow paths on CPU. CUDA keeps ``F.dropout``'s fused kernel.
    """

    def forward(self, x):
        return dropout(x, self.p, self.training)


def dropout(x, p: float, training: bool):
    """Functional form of :class:`Dropout`."""
    if not training or p == 0.0:
        return x
    keep_below = round((1.0 - p) * 2**15)
    if x.is_cuda or not enabled() or not 0 < keep_below < 2**15 or \
            torch.compiler.is_compiling():  # 15 bits cannot express p; compiled: fused
        return F.dropout(x, p, training=True)
    return _BitMaskDropout.apply(x, keep_below)


class _BitMaskDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, keep_below):
        # A lane's low 15 bits minus keep_below is negative exactly for kept elements, so
        # the arithmetic shift by 15 leaves -1 (all bits set) where kept and 0 where dropped.
        lanes = random_int16(x.numel()).view(x.shape)
        keep = lanes.bitwise_and_(0x7FFF).sub_(keep_below).bitwise_right_shift_(15)
        ctx.save_for_backward(keep.to(torch.int8))
        ctx.scale = 2**15 / keep_below
        return x * _scaled_mask(keep, x.dtype, ctx.scale)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad * _scaled_mask(keep, grad.dtype, ctx.scale), None


_SAME_SIZE_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _scaled_mask(keep, dtype, scale):
    """-1/0 integer mask -> ``scale``/0 in ``dtype``: -1 & bits(scale) is bits(scale)."""
    as_int = _SAME_SIZE_INT[dtype.itemsize]
    return keep.to(as_int).bitwise_and_(_bits_of(scale, dtype, as_int)).view(dtype)


@functools.lru_cache(maxsize=None)
def _bits_of(value: float, dtype, as_int) -> int:
    return torch.tensor(value, dtype=dtype).view(as_int).item()


def random_int16(n: int) -> torch.Tensor:
    """n uniformly random int16 values from SplitMix64 over a counter.

    The counter's seed is drawn from torch's generator, so ``torch.manual_seed`` (and
    fairseq's ``--seed``) make the bits reproducible. torch's CPU ``random_()`` runs the
    Mersenne Twister on one thread at ~2.5 ns per 64-bit value; these dozen whole-tensor
    integer ops run vectorised on every thread, at about half the time or less.
    """
    seed = torch.empty((), dtype=torch.int64).random_().item()
    return splitmix64(torch.arange((n + 3) // 4, dtype=torch.int64), seed).view(torch.int16)[:n]
