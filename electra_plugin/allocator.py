"""Keep freed memory in the process during CPU training (glibc only).

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

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -2, -3, -4
RETAINED = ((M_MMAP_MAX, 0),  # every block from the heap, none mapped and unmapped per use
            (M_TRIM_THRESHOLD, (1 << 31) - 1),  # never give the heap top back
            (M_TOP_PAD, 64 << 20))  # grow the heap in 64 MB steps
# glibc's own behaviour once its dynamic mmap threshold has risen to its 32 MB cap (the trim
# threshold follows at twice that): the best a process without this module converges to
GLIBC_STEADY_STATE = ((M_MMAP_MAX, 65536), (M_MMAP_THRESHOLD, 32 << 20),
                      (M_TRIM_THRESHOLD, 64 << 20), (M_TOP_PAD, 128 << 10))

@functools.lru_cache(maxsize=None)
def _glibc():
    """The process's C library where it is glibc, else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(None)


def _mallopt(settings) -> bool:
    libc = _glibc()
    return libc is not None and all(libc.mallopt(param, value) == 1
                                    for param, value in settings)


def retain_freed_memory() -> bool:
    """Keep freed memory in the process for reuse; True where glibc now does."""
    return _mallopt(RETAINED)


def release_freed_memory() -> bool:
    """Back to glibc's steady-state behaviour, heap top trimmed: how code that does not call
    :func:`retain_freed_memory` runs (the benchmark's peer, timed in the same process)."""
    released = _mallopt(GLIBC_STEADY_STATE)
    if released:
        _glibc().malloc_trim(0)
    return released
