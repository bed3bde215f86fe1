"""Pre-training examples as the official builder makes them: ``<s> A </s> B </s>`` segment
pairs, the model reading token type 1 on B (``--sample-break-mode segment_pairs``).

The rules of google-research/electra ``build_pretraining_dataset.py`` (ExampleBuilder),
over the lines of fairseq's binarized text (a line is a sentence or paragraph; an empty line
ends a document):

- lines are gathered until they hold the target length (counted without the 3 specials) or
  the document ends; the target is ``tokens_per_sample``, and after each example, with
  probability 0.05, a random length in [5, tokens_per_sample] instead;
- with probability 0.1 the example is one segment (the first segment's target is unbounded);
  otherwise the first segment aims at (target - 3) // 2 tokens: a line joins it while it is
  empty or the line fits under that aim, or, with probability 0.5, when the second segment is
  still empty and the first is short of its aim; every other line joins the second segment;
- the first segment is cut to tokens_per_sample - 2 tokens, the second to what is left after
  the first and 3 specials.

Random draws come from a generator seeded with ``--seed``, so the examples (and a resumed
run's batches) are the same each time; the official builder runs once, unseeded.
"""

from typing import List, Tuple

import numpy as np
import torch
from fairseq.data import FairseqDataset

SINGLE_SEGMENT_PROB = 0.1
SHORT_TARGET_PROB = 0.05
MIN_TARGET = 5


def build_examples(line_lengths: np.ndarray, max_length: int, rng: np.random.RandomState
                   ) -> List[Tuple[List[int], List[int], int, int]]:
    """-> per example (lines of A, lines of B, tokens kept of A, tokens kept of B).

    ``line_lengths``: tokens of each line without its end-of-line ``</s>``; 0 ends a
    document. ``max_length``: tokens per example with ``<s>`` and both ``</s>``.
    """
    examples = []
    target = max_length
    current: List[int] = []
    current_length = 0

    def create():
        nonlocal target, current, current_length
        if rng.random_sample() < SINGLE_SEGMENT_PROB:
            first_target = float("inf")
        else:
            first_target = (target - 3) // 2
        first, second, first_len, second_len = [], [], 0, 0
        for line in current:
            n = int(line_lengths[line])
            if (first_len == 0 or first_len + n < first_target or
                    (second_len == 0 and first_len < first_target and
                     rng.random_sample() < 0.5)):
                first.append(line)
                first_len += n
            else:
                second.append(line)
                second_len += n
        first_len = min(first_len, max_length - 2)
        second_len = min(second_len, max(0, max_length - first_len - 3))
        examples.append((first, second if second_len else [], first_len, second_len))
        current, current_length = [], 0
        if rng.random_sample() < SHORT_TARGET_PROB:
            target = int(rng.randint(MIN_TARGET, max_length + 1))
        else:
            target = max_length

    for line, n in enumerate(line_lengths):
        if n == 0:
            if current_length:
                create()
            continue
        current.append(line)
        current_length += int(n)
        if current_length >= target:
            create()
    if current_length:  # the official builder ends each file with an empty line
        create()
    return examples


class SegmentPairDataset(FairseqDataset):
    """``<s> A </s> B </s>`` examples (``<s> A </s>`` for a single segment) over a dataset of
    binarized lines, each ending in ``</s>``."""

    def __init__(self, lines, max_length: int, bos: int, eos: int, seed: int):
        self.lines = lines
        self.bos, self.eos = bos, eos
        lengths = np.asarray(lines.sizes, dtype=np.int64) - 1  # without each line's </s>
        self.examples = build_examples(lengths, max_length,
                                       np.random.RandomState(seed % 2**32))
        self._sizes = np.array([2 + a + (b + 1 if b else 0) for _, _, a, b in self.examples],
                               dtype=np.int64)

    def segment(self, lines, keep):
        if not lines:
            return []
        pieces = torch.cat([self.lines[i][:-1] for i in lines])
        return [pieces[:keep]]

    def __getitem__(self, index):
        first, second, first_len, second_len = self.examples[index]
        bos, eos = torch.tensor([self.bos]), torch.tensor([self.eos])
        parts = [bos, *self.segment(first, first_len), eos]
        if second_len:
            parts += [*self.segment(second, second_len), eos]
        return torch.cat(parts).long()

    def __len__(self):
        return len(self.examples)

    @property
    def sizes(self):
        return self._sizes

    def num_tokens(self, index):
        return int(self._sizes[index])

    def size(self, index):
        return int(self._sizes[index])

    @property
    def supports_prefetch(self):
        return False
