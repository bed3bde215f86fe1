"""Text -> fairseq's binarized .bin/.idx: directly through the tokenizer, or fairseq-preprocess.

:func:`binarize_text` is electra-prepare's path: the tokenizer's library (sentencepiece or
``tokenizers``) encodes batches of lines straight into dictionary ids (see
``TextTokenizer.encode_ids``), which go to the
.bin file as they come, in fairseq's mmap format, with no text of pieces in between and
memory bounded by one batch (plus 4 bytes of index per line). The files are byte for byte
what fairseq-preprocess writes for the same pieces. :func:`fairseq_preprocess` stays for
the GLUE data, whose lines are cut to fit pairs first.
"""

import logging
import os
import struct
import sys
import tempfile
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from ..user_io.errors import ElectraUsageError
from ..user_io.output_dir import lacks
from ..user_io.partial_output import full_destination, unusable_destination, write_error

# electra-prepare builds its output in a hidden directory of --destdir with this
# prefix and moves it in when done: one left behind marks an interrupted run.
STAGING_PREFIX = ".prepare_data-"
# One batch of text for the tokenizer: large enough to keep its threads busy, small
# enough that memory stays bounded whatever the corpus size.
BATCH_BYTES = 4 << 20
EOS = 2  # fairseq's </s>, appended to every line as fairseq-preprocess does


def _batches(path: str, progress) -> Iterator[List[str]]:
    """Lines of a UTF-8 file (newline removed), in batches of about BATCH_BYTES."""
    batch, size = [], 0
    with open(path, "rb") as f:
        for line in f:
            batch.append(line.rstrip(b"\n").decode("utf-8"))
            size += len(line)
            if size >= BATCH_BYTES:
                progress.update(size)
                yield batch
                batch, size = [], 0
    if batch:
        progress.update(size)
        yield batch


def _write_index(path: str, dtype, sizes: np.ndarray) -> None:
    """fairseq's MMapIndexedDataset index (what ``MMapIndexedDataset.Index.writer`` writes),
    with the pointers computed by numpy rather than a Python loop over every line."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset, _dtype_header_code

    sizes = sizes.astype(np.int32)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], dtype=np.int64, out=pointers[1:])
    with open(path, "wb") as f:
        f.write(MMapIndexedDataset.Index._HDR_MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", _dtype_header_code(dtype)))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(sizes.tobytes(order="C"))
        f.write((pointers * np.dtype(dtype).itemsize).tobytes(order="C"))


def binarize_text(raw_path: str, out_prefix: str, tokenizer, n_symbols: int, threads: int = 1,
                  unk: int = 3, log: Optional[Callable[[str], None]] = None) -> Dict[str, int]:
    """Encode a raw split (one normalised line per line, an empty line between documents)
    into ``out_prefix.bin``/``.idx``; returns counts (lines, pieces, unk, bytes: the byte
    pieces of ``tokenizer.byte_ids()``, breaks).

    Each line becomes its ids + ``</s>``; one ``</s>``-only item marks a document break
    (before the next line, never at the start or end); lines that give no ids at all are
    dropped (and count as a break, as in the pieces text fairseq-preprocess read).
    ``n_symbols`` (dict.txt entries + 4 specials) picks the dtype, as in fairseq-preprocess.
    """
    from fairseq.data.indexed_dataset import best_fitting_int_dtype
    from tqdm import tqdm

    dtype = best_fitting_int_dtype(n_symbols)
    stats = {"lines": 0, "pieces": 0, "unk": 0, "bytes": 0, "breaks": 0}
    byte_ids = tokenizer.byte_ids()
    all_sizes: List[np.ndarray] = []
    pending_break = wrote_any = False
    start = time.time()
    progress = tqdm(total=os.path.getsize(raw_path), unit="B", unit_scale=True,
                    desc=os.path.basename(out_prefix), disable=None, file=sys.stderr,
                    mininterval=2)
    with open(out_prefix + ".bin", "wb") as data, progress:
        for lines in _batches(raw_path, progress):
            text = [line for line in lines if line]
            ids, sizes = tokenizer.encode_ids(text, threads)
            # The items of this batch in order: a line's ids + </s>, or a break's </s> alone.
            item_sizes, kept = [], iter(sizes.tolist())
            for line in lines:
                n = next(kept) if line else 0
                if n == 0:  # a document break, or a line without ids (dropped)
                    pending_break = wrote_any
                    continue
                if pending_break:
                    item_sizes.append(0)
                    pending_break = False
                item_sizes.append(n)
                wrote_any = True
            item_sizes = np.array(item_sizes, dtype=np.int64) + 1  # each item ends with </s>
            out = np.full(int(item_sizes.sum()), EOS, dtype=dtype)
            # where each id goes: its line's first slot in ``out`` + its place in the line
            line_items = item_sizes > 1
            firsts = (np.cumsum(item_sizes) - item_sizes)[line_items]
            line_starts = np.cumsum(sizes[sizes > 0]) - sizes[sizes > 0]
            out[np.repeat(firsts - line_starts, sizes[sizes > 0]) + np.arange(len(ids))] = ids
            data.write(out.tobytes(order="C"))
            all_sizes.append(item_sizes.astype(np.int32))  # the index's own type
            stats["lines"] += int(line_items.sum())
            stats["breaks"] += int((~line_items).sum())
            stats["pieces"] += len(ids)
            stats["unk"] += int(np.count_nonzero(ids == unk))
            if byte_ids.size:
                stats["bytes"] += int(np.count_nonzero(np.isin(ids, byte_ids)))
    sizes = np.concatenate(all_sizes) if all_sizes else np.zeros(0, dtype=np.int32)
    _write_index(out_prefix + ".idx", dtype, sizes)
    if log is not None:
        seconds = max(time.time() - start, 1e-9)
        log(f"binarized {os.path.basename(out_prefix)}: {stats['pieces']} tokens in "
            f"{seconds:.1f} s ({stats['pieces'] / seconds / 1e6:.2f}M tokens/s)")
    return stats


def pretraining_data_problem(data_dir: str,
                             splits: Sequence[str] = ("train", "valid")) -> Optional[str]:
    """Why ``data_dir`` is not electra-prepare's output with ``splits``, or None when it is:
    what the electra task reads, dict.txt and each split's .bin/.idx."""
    return lacks(data_dir, ["dict.txt"] + [f"{s}.{e}" for s in splits for e in ("bin", "idx")])


def fairseq_preprocess(destdir: str, srcdict: Optional[str], splits: Dict[str, str],
                       workers: int = 1, log=None) -> None:
    """Binarize text files with ``fairseq-preprocess --only-source``.

    ``splits`` maps fairseq's options (``trainpref``, ``validpref``, ``testpref``) to file
    prefixes (comma-separated prefixes give valid, valid1, ...). fairseq's ``main`` runs in
    this process: a new interpreter's start-up and imports (about 4 s) cost more than a GLUE
    task's binarizing. Its log stays out of the caller's, but for the lines handed to ``log``.
    """
    from fairseq import options

    argv = ["--only-source", "--destdir", destdir, "--workers", str(workers)]
    if srcdict:
        argv += ["--srcdict", srcdict]
    for option, prefix in splits.items():
        argv += [f"--{option}", prefix]
    args = options.get_preprocessing_parser().parse_args(argv)
    preprocess = _fairseq_preprocess_module()
    fairseq_log = preprocess.logger
    handlers, propagate = list(fairseq_log.handlers), fairseq_log.propagate
    lines = _Lines(log)
    fairseq_log.addHandler(lines)
    fairseq_log.propagate = False
    try:
        preprocess.main(args)
    except Exception as error:  # noqa: BLE001 - fairseq's own errors, given as one line
        reason = full_destination(error)
        if reason:
            raise write_error(destdir, reason) from error
        raise ElectraUsageError(f"fairseq-preprocess failed: {type(error).__name__}: "
                                f"{error}") from error
    finally:  # main adds a log file handler on every call: keep none of them open
        for handler in set(fairseq_log.handlers) - set(handlers):
            fairseq_log.removeHandler(handler)
            handler.close()
        fairseq_log.propagate = propagate


def _fairseq_preprocess_module():
    """``fairseq_cli.preprocess``, imported without the root logging set-up it makes on
    import (a library leaves the caller's logging as it was)."""
    root = logging.getLogger()
    guard = logging.NullHandler()  # basicConfig does nothing where root has a handler
    root.addHandler(guard)
    try:
        from fairseq_cli import preprocess
    finally:
        root.removeHandler(guard)
    return preprocess


class _Lines(logging.Handler):
    """fairseq-preprocess's summary lines (its dictionary and each split's counts) to
    ``log``."""

    def __init__(self, log):
        super().__init__(logging.INFO)
        self.log = log

    def emit(self, record):
        message = record.getMessage()
        if self.log is not None and ("Dictionary:" in message or "sents," in message):
            self.log("fairseq-preprocess: " + message)


# the longest example a preparation command writes: the modern body's context (a model reads
# what its --max-positions allows, which the fine-tuning tasks check)
MAX_SEQ_LEN = 8192


def writable_destdir(destdir: str) -> None:
    """Make ``destdir`` and try a file in it now: a read-only one is one line before any work,
    not a traceback from fairseq-preprocess after it."""
    try:
        os.makedirs(destdir, exist_ok=True)
        tempfile.TemporaryFile(dir=destdir).close()
    except OSError as e:
        raise unusable_destination(f"cannot write into --destdir {destdir}", e)
