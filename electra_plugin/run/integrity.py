"""Checks that a binarized split (fairseq's mmap ``.bin``/``.idx`` pair) is whole.

fairseq reads the index lazily and the data only item by item, so a copy cut short or a
pair from two different binarizations fails hours into training with numpy's "offset must
be non-negative" from deep inside a batch. Checking the two files against each other when a
split loads costs one pass over the index and names the damaged file instead.
"""

import os
import struct

import numpy as np
from fairseq.data.indexed_dataset import MMapIndexedDataset, _code_to_dtype

from ..user_io.errors import ElectraUsageError

MAGIC = MMapIndexedDataset.Index._HDR_MAGIC
HEADER = len(MAGIC) + 8 + 1 + 8  # magic, version, dtype code, item count
FIX = "the files are damaged or from different runs; binarize the text again into a fresh directory"


def check_binarized(prefix: str) -> None:
    """Raise a one-line :class:`ElectraUsageError` if ``prefix.idx``/``prefix.bin`` disagree.

    A split with neither file is left to the caller (fairseq reports missing splits); other
    dataset formats (fairseq's legacy ``TNTIDX`` or raw text) are not checked here.
    """
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    has_idx, has_bin = os.path.isfile(idx), os.path.isfile(bin_)
    if not has_idx and not has_bin:
        return
    if not has_idx or not has_bin:
        present, missing = (idx, bin_) if has_idx else (bin_, idx)
        raise ElectraUsageError(
            f"{missing} is missing next to {present}; binarize the text again into a fresh "
            f"directory")
    with open(idx, "rb") as f:
        header = f.read(HEADER)
    if len(header) < HEADER:
        if MAGIC.startswith(header[:len(MAGIC)]):
            raise ElectraUsageError(f"{idx} is truncated (a {len(header)}-byte header); {FIX}")
        return  # too short for fairseq's mmap format: another format
    if header[:len(MAGIC)] != MAGIC:
        return  # another of fairseq's formats
    version, code, count = struct.unpack_from("<QBQ", header, len(MAGIC))
    if version != 1 or code not in _code_to_dtype:
        raise ElectraUsageError(f"{idx} has a damaged header (version {version}, dtype code "
                                f"{code}); {FIX}")
    idx_bytes = os.path.getsize(idx)
    if idx_bytes != HEADER + 12 * count:
        raise ElectraUsageError(
            f"{idx} is damaged: its header promises {count} items ({HEADER + 12 * count} "
            f"bytes) but the file has {idx_bytes} bytes; {FIX}")
    itemsize = np.dtype(_code_to_dtype[code]).itemsize
    sizes = np.memmap(idx, dtype=np.int32, mode="r", offset=HEADER, shape=(count,))
    pointers = np.memmap(idx, dtype=np.int64, mode="r", offset=HEADER + 4 * count,
                         shape=(count,))
    lengths = sizes.astype(np.int64) * itemsize
    expected = np.zeros(count, dtype=np.int64)
    np.cumsum(lengths[:-1], out=expected[1:])
    if (sizes < 0).any() or not np.array_equal(pointers, expected):
        raise ElectraUsageError(f"{idx} is damaged (its item offsets do not follow its item "
                                f"sizes); {FIX}")
    promised = int(lengths.sum())
    held = os.path.getsize(bin_)
    if held < promised:
        raise ElectraUsageError(
            f"{bin_} is truncated: {idx} promises {promised} bytes, the file holds {held}; "
            f"{FIX}")
    if held > promised:
        raise ElectraUsageError(
            f"{bin_} does not match {idx}: the index describes {promised} bytes, the file "
            f"holds {held}; {FIX}")
