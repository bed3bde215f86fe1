"""Corpus-scale WordPiece ids through a cache of space-separated words.

BERT's pipeline never looks across a space: its normaliser maps characters one at a time,
its pre-tokeniser splits at every whitespace, and WordPiece works word by word. So a line's
ids are the concatenation of the ids of its space-separated words, each encoded alone, and
a corpus repeats its words. The ``tokenizers`` pipeline (about a microsecond per character,
in its alignment tracking) then runs once per distinct word instead of once per word, and
the lines are assembled from the cached rows by numpy.
"""

from itertools import chain
from typing import Dict, List, Sequence, Tuple

import numpy as np
from tokenizers import AddedToken, Tokenizer

from electra_plugin.data.fast_tokenizer import unk_specials

# Distinct words kept at most (about 150 bytes each): memory stays bounded whatever the
# corpus; when full, the cache starts again from the current batch.
MAX_WORDS = 1 << 21
# Put between new words to encode them as one text: a special token, so it comes out as its
# own id. It starts and ends with a space, which no word holds, so it is found exactly where
# it was put (a word equal to its middle cannot shift the leftmost match).
_CUT = " <electra-word-cut> "


class WordCache:
    """``encode(lines)`` = ``tokenizer.encode_batch_fast(lines)``'s ids with every special
    id made ``<unk>``, for a tokenizer that never looks across a space (BERT WordPiece)."""

    def __init__(self, tokenizer: Tokenizer, specials: np.ndarray, max_words: int = MAX_WORDS):
        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())  # the caller's stays as it is
        self.tokenizer.add_special_tokens([AddedToken(_CUT, normalized=False)])
        self.cut = self.tokenizer.token_to_id(_CUT)
        self.specials = specials
        self.max_words = max_words
        self.clear()

    def clear(self) -> None:
        self.row: Dict[str, int] = {}  # word -> its row
        self.flat = np.zeros(0, dtype=np.int64)  # the rows' ids one after the other
        self.start = np.zeros(0, dtype=np.int64)  # of each row in ``flat``
        self.length = np.zeros(0, dtype=np.int64)

    def _add(self, words: List[str]) -> None:
        (encoding,) = self.tokenizer.encode_batch_fast([_CUT.join(words)],
                                                       add_special_tokens=False)
        ids = np.array(encoding.ids, dtype=np.int64)
        cuts = np.flatnonzero(ids == self.cut)
        if len(cuts) != len(words) - 1:
            raise RuntimeError(f"{len(cuts)} word cuts came back for {len(words)} words")
        ends = np.append(cuts, len(ids)) - np.arange(len(words))  # in ids without the cuts
        length = np.diff(ends, prepend=0)
        ids = unk_specials(np.delete(ids, cuts), self.specials)
        self.row.update(zip(words, range(len(self.start), len(self.start) + len(words))))
        self.start = np.concatenate([self.start, len(self.flat) + ends - length])
        self.length = np.concatenate([self.length, length])
        self.flat = np.concatenate([self.flat, ids])

    def encode(self, lines: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
        """(every line's ids one after the other, int64; the number of ids of each line)."""
        split = [line.split(" ") for line in lines]  # at least one word each, maybe ""
        words = list(chain.from_iterable(split))
        new = set(words).difference(self.row)
        if len(self.row) + len(new) > self.max_words:
            self.clear()
            new = set(words)
        if new:
            self._add(list(new))
        rows = np.fromiter(map(self.row.__getitem__, words), dtype=np.int64, count=len(words))
        length = self.length[rows]
        first = np.cumsum(length) - length  # of each word in the output
        ids = self.flat[np.repeat(self.start[rows] - first, length) + np.arange(length.sum())]
        counts = np.fromiter(map(len, split), dtype=np.int64, count=len(split))
        sizes = np.add.reduceat(length, np.cumsum(counts) - counts) if len(split) else counts
        return ids, sizes
