"""Dropout with a cheaper mask on CPU: 15 random bits per element from SplitMix64.

Part of :mod:`electra_plugin.speed`; with ``ELECTRA_SPEED=0`` (or ``-dropout``) it is ``F.dropout``.
Under ``torch.compile`` the mask is a comparison of uniform draws, which inductor generates
inside the kernel that applies it (no kernel or mask tensor of its own).
"""

import functools
import math
import struct
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data.splitmix import splitmix64
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
    if not enabled("dropout"):
        return F.dropout(x, p, training=True)
    if torch.compiler.is_compiling():  # uniform draws the compiler fuses into the kernel
        # that uses them (F.dropout under torch.func.grad stays a Bernoulli kernel of its own)
        keep = torch.rand(x.shape, device=x.device) >= p
        return x * keep.to(x.dtype) * (1.0 / (1.0 - p))
    below = keep_below(p)
    if x.is_cuda or not 0 < below < 2**15:  # 15 bits cannot express p
        return F.dropout(x, p, training=True)
    return _BitMaskDropout.apply(x, below)


class _BitMaskDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, below):
        # A lane's low 15 bits minus ``below`` is negative exactly for kept elements, so
        # the arithmetic shift by 15 leaves -1 (all bits set) where kept and 0 where dropped.
        keep = _keep_lanes(random_int16(x.numel()).view(x.shape), below)
        ctx.save_for_backward(keep.to(torch.int8))
        ctx.scale = 2**15 / below
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
    """The bit pattern of ``value`` in ``dtype`` as a signed integer, found on the host
    (a tensor's ``.item()`` would be a device read inside the step)."""
    if dtype == torch.bfloat16:  # fp32's top half, rounded to nearest even
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits - (1 << 16) * (bits >> 15)
    code = {torch.float16: ("<e", "<h"), torch.float32: ("<f", "<i"),
            torch.float64: ("<d", "<q")}[dtype]
    return struct.unpack(code[1], struct.pack(code[0], value))[0]


def random_int16(n: int, seed: Optional[torch.Tensor] = None, start: int = 0) -> torch.Tensor:
    """n uniformly random int16 values from SplitMix64 over a counter.

    The counter's seed is drawn from torch's generator (unless given), so
    ``torch.manual_seed`` (and fairseq's ``--seed``) make the bits reproducible. torch's CPU
    ``random_()`` runs the Mersenne Twister on one thread at ~2.5 ns per 64-bit value; these
    dozen whole-tensor integer ops run vectorised on every thread, at about half the time or
    less. ``seed`` and ``start`` (the first counter, 4 values per counter) give the same
    bits again, or any part of a larger draw, without keeping them.
    """
    if seed is None:
        seed = draw_seed()
    counters = torch.arange(start, start + (n + 3) // 4, dtype=torch.int64)
    return splitmix64(counters, seed).view(torch.int16)[:n]


def draw_seed() -> torch.Tensor:
    """A SplitMix64 seed from torch's generator, as a 0-d tensor: never read on the host."""
    return torch.empty((), dtype=torch.int64).random_()


def keep_below(p: float) -> int:
    """Dropout with probability p keeps a 15-bit lane below this (0 or 2**15: p cannot be
    expressed in 15 bits)."""
    return round((1.0 - p) * 2**15)


def scaled_keep_mask(shape, p: float, dtype, seed, start: int = 0) -> torch.Tensor:
    """:class:`Dropout`'s multiplier (``1 / keep probability`` where kept, 0 where dropped)
    of ``shape`` from the lanes ``random_int16(numel, seed, start)``: a part of a dropout
    mask recomputed where keeping it would cost memory."""
    below = keep_below(p)
    keep = _keep_lanes(random_int16(math.prod(shape), seed, start).view(shape), below)
    return _scaled_mask(keep, dtype, 2**15 / below)


def _keep_lanes(lanes, below: int) -> torch.Tensor:
    """-1 where a lane keeps its element, 0 where it drops it (in place on ``lanes``)."""
    return lanes.bitwise_and_(0x7FFF).sub_(below).bitwise_right_shift_(15)
