"""Keep freed memory in the process during CPU training (glibc only); part of
:mod:`electra_plugin.speed`.

glibc hands every block above its mmap threshold (at most 32 MB) straight back to the OS when
it is freed, and trims the heap top, so each update's large tensors (the generator's M x V
logits, B x T x H activations) arrive on fresh pages again: tens of thousands of page
faults per update, ~2.6 us each on these VMs, and with two threads the faulting threads also
queue on the process's memory-map lock. Serving everything from the heap and never trimming
it keeps those pages mapped: ~10% more tokens/s on 2 cores (docs/benchmarks.md). The price
is that the process keeps its peak memory until it exits, which a training run does anyway.
"""

import ctypes
import functools
import platform

from .switch import enabled

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
RETAINED = ((M_MMAP_MAX, 0),  # every block from the heap, none mapped and unmapped per use
            (M_TRIM_THRESHOLD, (1 << 31) - 1),  # never give the heap top back
            (M_TOP_PAD, 64 << 20))  # grow the heap in 64 MB steps


@functools.lru_cache(maxsize=None)
def _glibc():
    """The process's C library where it is glibc, else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(None)


def retain_freed_memory() -> bool:
    """Keep freed memory in the process for reuse; True where glibc now does (never with
    ``ELECTRA_SPEED=0``)."""
    libc = _glibc() if enabled("allocator") else None
    return libc is not None and all(libc.mallopt(param, value) == 1
                                    for param, value in RETAINED)
