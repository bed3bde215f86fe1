"""The one switch of :mod:`electra_plugin.speed`: the ``ELECTRA_SPEED`` environment variable.

``1`` (or unset): every part on; ``0``: every part off, each path the plain PyTorch /
fairseq op; ``-window,-dropout``: only the parts named off, so that a benchmark can weigh one
of them in the same process. A word that names no part is refused in one line.
"""

import os
from functools import lru_cache
from typing import FrozenSet

from ..user_io.errors import ElectraUsageError

VARIABLE = "ELECTRA_SPEED"
# the parts that can be turned off alone (ELECTRA_SPEED=-PART), and what then runs instead
PARTS = {
    "accumulate": "the graphed step's gradients reach the parameters by autograd's "
                  "accumulation",
    "buckets": "fine-tuning batches at their own length instead of --length-buckets'",
    "cudagraphs": "the graphed step not replayed as CUDA graphs",
    "deferred": "fairseq's finiteness checks and logs after every update",
    "dropout": "F.dropout instead of the integer-hash mask (CPU)",
    "global": "SDPA with the T x T mask in the modern body's global layers (CPU)",
    "gradients": "the graphed step's backward by autograd, a second graph",
    "guards": "every dynamo guard of the graphed step kept",
    "launch": "each trial a new interpreter instead of a fork of a warm server",
    "seed": "torch.manual_seed before each step (fairseq's own)",
    "walks": "fairseq's walks over every module (training mode, update count)",
    "window": "the whole T x T scores, masked, in the modern body's local layers",
}


def enabled(part: str = "") -> bool:
    """False when ``ELECTRA_SPEED=0``, or for ``part`` when ``-part`` is among the words.
    Read at each call (the parsed value cached by its text), so a test can flip it."""
    if part and part not in PARTS:
        raise ValueError(f"{part!r} is no part of {VARIABLE} ({', '.join(PARTS)})")
    off = parts_off(os.environ.get(VARIABLE, "1"))
    return "" not in off and part not in off


@lru_cache(maxsize=8)
def parts_off(value: str) -> FrozenSet[str]:
    """The parts ``value`` turns off ("" for all); a word that names none is refused."""
    if value.strip() == "0":
        return frozenset([""])
    off = set()
    for word in filter(None, (w.strip() for w in value.split(","))):
        if word == "1":
            continue
        if not (word.startswith("-") and word[1:] in PARTS):
            raise ElectraUsageError(
                f"{VARIABLE}={value}: {word!r} names no part; give 0 (all off), 1 (all on) or "
                f"-PART,... with PART one of {', '.join(PARTS)}")
        off.add(word[1:])
    return frozenset(off)
