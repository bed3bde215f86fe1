"""How far a long loop of a command has come: a bar on a terminal, a log line now and then
elsewhere (a job's log, a notebook, a pipe), so that no prediction or scoring pass is silent
until its end."""

import logging
import os
import sys
import time
from typing import Iterable, Iterator, Optional, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
# seconds between two progress lines in a log (ELECTRA_PROGRESS_SECONDS to change it)
DEFAULT_INTERVAL = 30.0


def log_interval() -> float:
    try:
        return max(0.0, float(os.environ.get("ELECTRA_PROGRESS_SECONDS", DEFAULT_INTERVAL)))
    except ValueError:
        return DEFAULT_INTERVAL


def progress(items: Iterable[T], total: Optional[int], what: str, unit: str = "batches") -> \
        Iterator[T]:
    """``items``, one by one, while their count so far is shown: tqdm's bar when standard
    error is a terminal, else one line per :func:`log_interval` seconds and one at the end."""
    if sys.stderr.isatty():
        from tqdm import tqdm  # fairseq's own dependency

        yield from tqdm(items, total=total, desc=what, unit=f" {unit}", leave=False)
        return
    every, start = log_interval(), time.monotonic()
    last, done = start, 0
    for done, item in enumerate(items, 1):
        yield item
        now = time.monotonic()
        if now - last >= every:
            logger.info(f"{what}: {_count(done, total)} {unit} ({done / (now - start):.1f}/s)")
            last = now
    logger.info(f"{what}: {_count(done, total)} {unit} in {time.monotonic() - start:.1f} s")


def _count(done: int, total: Optional[int]) -> str:
    return f"{done}/{total} ({100 * done / total:.0f}%)" if total else str(done)
