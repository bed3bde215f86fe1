"""ELECTRA's input masking, deterministic per (seed, epoch, index)."""

import logging
from functools import lru_cache

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset, data_utils

logger = logging.getLogger(__name__)


def word_starts(dictionary) -> np.ndarray:
    """bool per symbol: its piece begins a word, for whole-word masking.

    WordPiece marks the pieces that continue a word (``##ing``), sentencepiece the ones that
    begin one (``▁the``); the dictionary follows the convention most of its symbols show
    (a stray ``##`` piece of sentencepiece text does not flip it). A dictionary with neither
    holds whole words already (fairseq-preprocess on word-tokenized text): every token is a
    word.
    """
    continues = np.array([s.startswith("##") for s in dictionary.symbols])
    begins = np.array([s.startswith("\u2581") for s in dictionary.symbols])
    if continues.sum() > begins.sum():
        logger.info("whole-word masking: WordPiece pieces ('##' continues a word)")
        return ~continues
    if begins.any():
        logger.info("whole-word masking: sentencepiece pieces ('\u2581' begins a word)")
        return begins
    logger.warning("whole-word masking: no '##' or '\u2581' pieces in the dictionary, so "
                   "every token is taken as a whole word")
    return np.ones(len(dictionary), dtype=bool)


class ElectraMaskingDataset(BaseWrapperDataset):
    """Picks ``mask_prob`` of the non-special tokens of each sample, as the official code does.

    Exactly ``max(1, round(mask_prob * n))`` of the ``n`` maskable positions are drawn without
    replacement; each picked position becomes ``<mask>`` with probability
    ``1 - leave_unmasked_prob - random_token_prob`` (official: 0.85), keeps its token with
    probability ``leave_unmasked_prob`` (official: 0.15) and becomes a random non-special
    token with probability ``random_token_prob`` (official: 0; BERT: 0.1 and 0.1).
    ``<s>``, ``</s>``, ``<pad>`` and ``<mask>`` are never picked.

    With ``word_starts`` (:func:`word_starts` of the dictionary) whole words are picked
    instead, as BERT's whole-word masking does: words in random order, each taken with all
    its pieces if it still fits the same count (one that does not is skipped; when none fits,
    the first is taken), so a word is never half masked; each picked piece then gets its own
    ``<mask>`` / unchanged / random draw. Specials end a word.

    Build the input and target views with :meth:`apply_mask`; both recompute the same mask
    from ``(seed, epoch, index)``, which is what makes runs and resumes reproducible.
    """

    @classmethod
    def apply_mask(cls, dataset, *args, **kwargs):
        return (cls(dataset, *args, **kwargs, return_target=False),
                cls(dataset, *args, **kwargs, return_target=True))

    def __init__(self, dataset, dictionary, mask_idx, seed=1, mask_prob=0.15,
                 leave_unmasked_prob=0.15, random_token_prob=0.0, word_starts=None,
                 return_target=False):
        super().__init__(dataset)
        assert 0.0 < mask_prob < 1.0 and 0.0 <= leave_unmasked_prob + random_token_prob <= 1.0
        self.pad_idx = dictionary.pad()
        self.mask_idx = mask_idx
        self.special = np.array(sorted({dictionary.bos(), dictionary.eos(), dictionary.pad(),
                                        mask_idx}))
        self.seed = seed
        self.mask_prob = mask_prob
        self.leave_unmasked_prob = leave_unmasked_prob
        self.random_token_prob = random_token_prob
        self.word_starts = word_starts
        # random replacements are drawn from the ordinary tokens: not specials, not <mask>
        self.random_ids = np.setdiff1d(np.arange(dictionary.nspecial, len(dictionary)),
                                       self.special)
        self.return_target = return_target
        self.epoch = 0

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return False  # the masks change every epoch

    def set_epoch(self, epoch, **unused):
        super().set_epoch(epoch)
        self.epoch = epoch

    def __getitem__(self, index):
        return self._masked(self.seed, self.epoch, index)[int(self.return_target)]

    @lru_cache(maxsize=8)
    def _masked(self, seed, epoch, index):
        """-> (input with masks, target: original token at picked positions, pad elsewhere)."""
        tokens = self.dataset[index]
        item = tokens.numpy()
        candidates = np.flatnonzero(~np.isin(item, self.special))
        picked = np.zeros(len(item), dtype=bool)
        if len(candidates) > 0:
            with data_utils.numpy_seed(seed, epoch, index):
                count = min(len(candidates), max(1, int(round(self.mask_prob * len(candidates)))))
                if self.word_starts is None:
                    chosen = np.random.choice(candidates, count, replace=False)
                else:
                    chosen = self._whole_words(item, candidates, count)
                    count = len(chosen)
                draw = np.random.rand(count)
                keep = draw < self.leave_unmasked_prob
                randomize = ~keep & (draw < self.leave_unmasked_prob + self.random_token_prob)
                random_tokens = np.random.choice(self.random_ids, int(randomize.sum()))
            picked[chosen] = True
            masked_input = item.copy()
            masked_input[chosen[~keep & ~randomize]] = self.mask_idx
            masked_input[chosen[randomize]] = random_tokens
        else:
            masked_input = item
        target = np.where(picked, item, self.pad_idx)
        return torch.from_numpy(masked_input), torch.from_numpy(target)

    def _whole_words(self, item, candidates, count):
        """Positions of whole words drawn at random until ``count`` pieces (within the seed)."""
        # a word starts at a piece that begins one or that follows a special (<s>, </s>)
        starts = self.word_starts[item[candidates]] | (np.diff(candidates, prepend=-2) != 1)
        word = np.cumsum(starts) - 1
        sizes = np.bincount(word)
        taken = np.zeros(len(sizes), dtype=bool)
        room = count
        order = np.random.permutation(len(sizes))
        for w in order:
            if sizes[w] <= room:
                taken[w] = True
                room -= sizes[w]
                if room == 0:
                    break
        if room == count:  # every word is longer than the count
            taken[order[0]] = True
        return candidates[taken[word]]
