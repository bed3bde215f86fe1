"""Plain text as documents (runs of non-blank lines), and the train/valid split that holds
out whole documents, so that no validation sentence has its neighbours in training."""

import logging
import math
import os
import random
import re

from ..user_io.errors import ElectraUsageError

logger = logging.getLogger(__name__)

# With fewer documents than this, the validation split is made of single lines.
MIN_DOCUMENTS_TO_SPLIT = 10
# bytes that are not UTF-8, as errors="surrogateescape" reads them
_UNDECODED = re.compile("[\udc80-\udcff]")


def open_text(path):
    try:
        return open(path, "r", encoding="utf-8", errors="surrogateescape")
    except OSError as e:
        raise ElectraUsageError(f"cannot read input file {path!r}: {e.strerror or e}")


def iter_lines(path, undecodable=None):
    """Lines of a text file, whitespace-normalised ('' for blank lines). Bytes that are not
    UTF-8 read as U+FFFD, as errors="replace" reads them; ``undecodable``, a dict, counts
    their lines ("lines") and keeps the first one's number ("first")."""
    with open_text(path) as f:
        try:
            for number, line in enumerate(f, start=1):
                if not line.isascii() and _UNDECODED.search(line):
                    line = line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                    if undecodable is not None:
                        undecodable["lines"] += 1
                        undecodable.setdefault("first", number)
                yield " ".join(line.split())
        except OSError as e:
            raise ElectraUsageError(f"cannot read input file {path!r}: {e.strerror or e}")


def check_input(path, option):
    if not os.path.exists(path):
        raise ElectraUsageError(f"{option} file {path!r} does not exist")
    if os.path.isdir(path):
        raise ElectraUsageError(f"{option} {path!r} is a directory, not a text file")
    if not os.access(path, os.R_OK):
        raise ElectraUsageError(f"cannot read {option} file {path!r}: permission denied")
    for line in iter_lines(path):
        if line:
            return
    raise ElectraUsageError(f"{option} file {path!r} is empty (no non-blank lines)")


def document_line_counts(paths):
    """Number of non-blank lines of each document; documents end at blank lines and files."""
    counts = []
    for path in paths:
        n = 0
        for line in iter_lines(path):
            if line:
                n += 1
            elif n:
                counts.append(n)
                n = 0
        if n:
            counts.append(n)
    return counts


def choose_valid_units(counts, fraction, min_lines, seed):
    """Indices of the units (documents) to hold out: about ``fraction`` of them, at least
    ``min_lines`` lines, never all of them."""
    n = len(counts)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    target = max(1, math.ceil(fraction * n))
    chosen, lines = [], 0
    for i in order:
        if len(chosen) >= n - 1:
            break
        if len(chosen) >= target and lines >= min_lines:
            break
        chosen.append(i)
        lines += counts[i]
    return set(chosen)


def write_splits(paths, valid_units, by_line, train_out, valid_out):
    """Copy the documents (or, with by_line, the lines) to the train/valid raw files,
    whitespace-normalised; in each output an empty line separates lines that came from
    different input documents."""
    outs = {"train": open(train_out, "w", encoding="utf-8", newline="\n"),
            "valid": open(valid_out, "w", encoding="utf-8", newline="\n") if valid_out else None}
    last_doc = {"train": None, "valid": None}
    stats = {"train": [0, 0], "valid": [0, 0]}  # documents, lines
    unit = doc = -1
    try:
        for path in paths:
            in_doc = False
            undecodable = {"lines": 0}
            for line in iter_lines(path, undecodable):
                if not line:
                    in_doc = False
                    continue
                if not in_doc:
                    doc += 1
                    in_doc = True
                    if not by_line:
                        unit += 1
                if by_line:
                    unit += 1
                split = "valid" if unit in valid_units else "train"
                if last_doc[split] != doc:
                    if last_doc[split] is not None:
                        outs[split].write("\n")
                    last_doc[split] = doc
                    stats[split][0] += 1
                outs[split].write(line + "\n")
                stats[split][1] += 1
            if undecodable["lines"]:
                logger.warning(
                    f"{path}: {undecodable['lines']} line(s) hold bytes that are not UTF-8 "
                    f"(the first: line {undecodable['first']}), read as U+FFFD; if the file is "
                    f"in another encoding, convert it first (iconv -f latin1 -t utf-8)")
    finally:
        for f in outs.values():
            if f:
                f.close()
    return stats


def copy_docs(paths, out):
    return write_splits(paths, set(), False, out, None)["train"]
