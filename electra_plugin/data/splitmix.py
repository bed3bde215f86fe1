"""Counter-based random numbers: SplitMix64 on int64 tensors.

SplitMix64 (Steele, Lea and Flood 2014; Vigna's constants) turns a counter into 64 random
bits with a dozen whole-tensor integer ops and no generator state, so a value depends only
on its (state, counter) and any subset of values can be computed on its own, in any order,
by any process. Dropout's bits (:mod:`electra_plugin.speed.dropout`) and the electra task's
masks (:mod:`electra_plugin.data.masking`) both draw from here; the masks must not depend on
the ``ELECTRA_SPEED`` switch, hence this module lives outside ``speed/``.
"""

import torch

# the constants as two's-complement int64: torch's int64 products wrap like uint64 ones
GOLDEN = 0x9E3779B97F4A7C15 - 2**64
_MULTIPLIERS = ((30, 0xBF58476D1CE4E5B9 - 2**64), (27, 0x94D049BB133111EB - 2**64))


def splitmix64(counter, state) -> torch.Tensor:
    """SplitMix64's output number ``counter`` of the stream seeded with ``state``.

    ``counter`` and ``state``: int64 tensors (or an int for one of them) that broadcast;
    returns a new int64 tensor of their broadcast shape: the finaliser of
    ``state + counter * GOLDEN``. Chained (the output as the next call's state), it hashes
    a tuple of integers.
    """
    if not torch.is_tensor(state):
        state = torch.tensor(state, dtype=torch.int64)
    z = torch.add(state, counter, alpha=GOLDEN)
    for shift, multiplier in _MULTIPLIERS:
        _xor_shifted_right_(z, shift).mul_(multiplier)
    return _xor_shifted_right_(z, 31)


def shift_right(z, shift) -> torch.Tensor:
    """z >> shift as a logical shift (a new tensor): the top bits are 0, the result >= 0."""
    return z.bitwise_right_shift(shift).bitwise_and_(2 ** (64 - shift) - 1)


def _xor_shifted_right_(z, shift):
    """z ^= z >> shift, the shift logical."""
    return z.bitwise_xor_(shift_right(z, shift))
