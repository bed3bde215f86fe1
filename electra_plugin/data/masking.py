"""ELECTRA's input masking, a whole batch at once in the collater, counter-based random."""

import logging

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset, FairseqDataset
from torch.nn.utils.rnn import pad_sequence

from .splitmix import shift_right, splitmix64

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


def max_predictions(mask_prob: float, length: int) -> int:
    """The official ``max_predictions_per_seq`` for sequences of ``length`` tokens:
    int((mask_prob + 0.005) x length), 19 at 128 and 79 at 512 for 0.15. Every row of a batch
    gets this many prediction slots, so the step's shapes depend on the batch's length only."""
    return max(1, int((mask_prob + 0.005) * length))


# the independent random streams of a row: (seed, epoch, index, stream, position) -> 64 bits
_PICK, _DRAW, _TOKEN, _WORD = range(4)
_NEVER = torch.iinfo(torch.int64).max  # the sort key of what must not be picked


class ElectraMaskingDataset(BaseWrapperDataset):
    """Picks ``mask_prob`` of the non-special tokens of each sample, as the official code does.

    Exactly ``max(1, min(P, round(mask_prob * n)))`` of the ``n`` maskable positions are drawn
    without replacement, ``P`` the official cap :func:`max_predictions` of ``max_length`` (the
    run's --tokens-per-sample; by default the dataset's longest block); each picked position becomes ``<mask>`` with probability
    ``1 - leave_unmasked_prob - random_token_prob`` (official: 0.85), keeps its token with
    probability ``leave_unmasked_prob`` (official: 0.15) and becomes a random non-special
    token with probability ``random_token_prob`` (official: 0; BERT: 0.1 and 0.1).
    ``<s>``, ``</s>``, ``<pad>`` and ``<mask>`` are never picked; a sample without any other
    token is left unmasked.

    With ``word_starts`` (:func:`word_starts` of the dictionary) whole words are picked
    instead, as BERT's whole-word masking does: words in random order, each taken with all
    its pieces if it still fits the same count (one that does not is skipped; when none fits,
    the first is taken), so a word is never half masked; each picked piece then gets its own
    ``<mask>`` / unchanged / random draw. Specials end a word.

    Each row then has ``P`` prediction slots: its picked positions in ascending order, then
    padding slots of weight 0 that point at a position the row did not pick, as the official
    ``masked_lm_positions`` / ``masked_lm_weights``; the step gathers by these indices, so its
    shapes never depend on how many tokens were picked.

    Items are the unmasked blocks; :meth:`collater` pads a batch and masks it with a few
    whole-batch tensor ops (masking item by item in numpy cost ~0.6 ms a sequence, enough
    to starve a GPU). Every random number is SplitMix64 of (seed, epoch, dataset index, stream,
    position), so a sample's mask is a pure function of those, whatever batch or loader
    worker it lands in: runs and resumes repeat exactly.
    """

    def __init__(self, dataset, dictionary, mask_idx, seed=1, mask_prob=0.15,
                 leave_unmasked_prob=0.15, random_token_prob=0.0, word_starts=None,
                 pad_to_multiple=1, max_length=None):
        super().__init__(dataset)
        assert 0.0 < mask_prob < 1.0 and 0.0 <= leave_unmasked_prob + random_token_prob <= 1.0
        self.pad_idx = dictionary.pad()
        self.mask_idx = mask_idx
        self.special = torch.tensor(sorted({dictionary.bos(), dictionary.eos(),
                                            dictionary.pad(), mask_idx}))
        self.seed = seed
        self.mask_prob = mask_prob
        self.leave_unmasked_prob = leave_unmasked_prob
        self.random_token_prob = random_token_prob
        self.word_starts = None if word_starts is None else torch.from_numpy(word_starts)
        # the official cap counts slots of the longest sequence the run may have, not the
        # batch's: a sample's mask then depends on no other sample of its batch
        self.pad_to_multiple = pad_to_multiple
        self.max_length = max_length or int(max(self.sizes, default=1))
        self.slots = max_predictions(mask_prob, self.max_length)
        # random replacements are drawn from the ordinary tokens: not specials, not <mask>
        self.random_ids = torch.from_numpy(np.setdiff1d(
            np.arange(dictionary.nspecial, len(dictionary)), self.special.numpy()))
        self.epoch = 0

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return False  # the masks change every epoch

    def set_epoch(self, epoch, **unused):
        super().set_epoch(epoch)
        self.epoch = epoch

    # sizes: the wrapped blocks' (<s> included); fairseq's own batching and filtering on them
    # (the wrapped blocks cannot count tokens by index, and an indexed dataset read whole, as
    # --sample-break-mode eos does, has no batch shapes to give)
    def num_tokens(self, index):
        return self.sizes[index]

    def num_tokens_vec(self, indices):
        return self.sizes[indices]

    size = num_tokens
    batch_by_size = FairseqDataset.batch_by_size
    get_batch_shapes = FairseqDataset.get_batch_shapes
    filter_indices_by_size = FairseqDataset.filter_indices_by_size

    def __getitem__(self, index):
        return {"id": index, "source": self.dataset[index]}

    def collater(self, samples):
        """Items -> the batch fairseq's ``masked_lm`` layout has, plus what the step reads.

        ``net_input``: ``src_tokens`` (B x T, masked, right-padded, T rounded up to a
        multiple of ``pad_to_multiple`` but at most ``max_length``), ``src_lengths`` (B),
        ``masked_positions`` (B*P flat indices into B x T: each row's slots, see the class),
        ``masked_weights`` (B*P float: 1 for a picked position, 0 for a padding slot) and ``has_padding`` (a bool:
        whether ``src_tokens`` holds ``<pad>``), so that the model finds neither on the
        device; ``target`` (B x T: the original token at picked positions, ``<pad>``
        elsewhere), ``id``, ``nsentences``, ``ntokens`` and ``nmasked`` (host ints).
        """
        if len(samples) == 0:
            return {}
        sources = [s["source"] for s in samples]
        tokens = pad_sequence(sources, batch_first=True, padding_value=self.pad_idx)
        extra = min(-tokens.size(1) % self.pad_to_multiple,
                    max(self.max_length - tokens.size(1), 0))
        if extra:  # a few lengths, so that a compiled step meets a few shapes
            tokens = torch.nn.functional.pad(tokens, (0, extra), value=self.pad_idx)
        lengths = torch.tensor([s.numel() for s in sources])
        ids = torch.tensor([s["id"] for s in samples])
        streams = self._row_streams(ids)
        candidates = ~torch.isin(tokens, self.special)
        slots = self.slots
        picked = (self._pick_pieces if self.word_starts is None else self._pick_words)(
            streams, tokens, candidates, slots)
        picked &= picked.cumsum(1) <= slots  # a whole word longer than the cap: its start
        slot_positions, weights = prediction_slots(picked, slots)
        positions = slot_positions[weights.bool()]  # the picked ones, ascending
        src = tokens.clone()
        src.view(-1)[positions] = self._replacements(streams, tokens, positions)
        return {
            "id": ids,
            "net_input": {"src_tokens": src, "src_lengths": lengths,
                          "masked_positions": slot_positions, "masked_weights": weights,
                          "has_padding": bool(src.eq(self.pad_idx).any())},
            "target": tokens.masked_fill(~picked, self.pad_idx),
            "nsentences": len(samples),
            "ntokens": int(lengths.sum()),
            "nmasked": len(positions),
        }

    def _row_streams(self, ids):
        """B x streams: the state of each random stream of each row."""
        row = splitmix64(ids, splitmix64(self.epoch, self.seed))
        return splitmix64(torch.arange(4), row.unsqueeze(1))

    @staticmethod
    def _random(streams, stream, rows, columns):
        """64 random bits of one stream per (row, column), ``rows`` and ``columns``
        broadcast (B x 1 and T: the whole batch; M and M: flat positions)."""
        return splitmix64(columns, streams[rows, stream])

    @classmethod
    def _keys(cls, streams, stream, length):
        """B x T non-negative sort keys below :data:`_NEVER`, one per position."""
        rows, columns = torch.arange(len(streams)).unsqueeze(1), torch.arange(length)
        return shift_right(cls._random(streams, stream, rows, columns), 2)

    def _counts(self, candidates, slots):
        """B: max(1, min(slots, round(mask_prob * n))) of the n candidates of each row (the
        official count), 0 if none."""
        n = candidates.sum(1)  # rounded in float64 (half to even) as Python's round()
        count = (n.double() * self.mask_prob).round().long().clamp(min=1, max=slots)
        return torch.where(n > 0, count, 0)

    def _pick_pieces(self, streams, tokens, candidates, slots):
        """B x T: each row's count candidates with the smallest random keys."""
        keys = self._keys(streams, _PICK, tokens.size(1))
        order = keys.masked_fill_(~candidates, _NEVER).argsort(dim=1)
        rank_picked = torch.arange(tokens.size(1)) < self._counts(candidates, slots).unsqueeze(1)
        return torch.zeros_like(candidates).scatter_(1, order, rank_picked)

    def _pick_words(self, streams, tokens, candidates, slots):
        """B x T: whole words in random order, each taken if it fits the row's count."""
        batch, length = tokens.shape
        # a word starts at a piece that begins one or that follows a special (<s>, </s>)
        after_special = torch.ones_like(candidates)
        after_special[:, 1:] = ~candidates[:, :-1]
        starts = candidates & (self.word_starts[tokens] | after_special)
        word = starts.cumsum(1).sub_(1)
        slot = torch.where(candidates, word, length)  # non-candidates to a spare column
        sizes = torch.zeros(batch, length + 1, dtype=torch.long).scatter_add_(
            1, slot, torch.ones_like(slot))[:, :length]
        keys = self._keys(streams, _WORD, length)
        word_keys = torch.full((batch, length + 1), _NEVER).scatter_(
            1, torch.where(starts, word, length), keys)[:, :length]
        order = word_keys.argsort(dim=1)  # words in random order, non-words (size 0) last
        in_order = sizes.gather(1, order).numpy()
        count = self._counts(candidates, slots).numpy()
        room = count.copy()
        taken = np.zeros(in_order.shape, dtype=bool)
        for j in range(int(starts.sum(1).max())):  # the greedy skip, all rows at once
            if not room.any():
                break
            fits = in_order[:, j] <= room
            taken[:, j] = fits
            room -= np.where(fits, in_order[:, j], 0)
        taken[:, 0] |= (room == count) & (count > 0)  # none fitted: the first word
        taken_words = torch.zeros(batch, length, dtype=torch.bool).scatter_(
            1, order, torch.from_numpy(taken))
        return candidates & taken_words.gather(1, word.clamp(min=0))

    def _replacements(self, streams, tokens, positions):
        """M: what each picked position shows: <mask>, its own token or a random one."""
        rows, columns = positions // tokens.size(1), positions % tokens.size(1)
        draw = shift_right(self._random(streams, _DRAW, rows, columns), 11).double() * 2.0**-53
        shown = torch.where(draw < self.leave_unmasked_prob, tokens.view(-1)[positions],
                            self.mask_idx)
        randomize = (draw >= self.leave_unmasked_prob) & \
            (draw < self.leave_unmasked_prob + self.random_token_prob)
        if self.random_token_prob > 0:
            at = randomize.nonzero().squeeze(1)
            choice = self._random(streams, _TOKEN, rows[at], columns[at])
            shown[at] = self.random_ids[shift_right(choice, 1) % len(self.random_ids)]
        return shown


def prediction_slots(picked, slots: int):
    """B x T picked -> (B x P flat indices into B x T, B x P float weights): each row's picked
    positions ascending, then padding slots (weight 0) at the row's first unpicked position,
    so that writing a padding slot's own token back changes nothing and no slot shares a
    picked position (every row keeps an unpicked position: its ``<s>``)."""
    batch, length = picked.shape
    columns = torch.arange(length)
    order = torch.where(picked, columns, length + columns).sort(1).values[:, :slots]
    order = torch.nn.functional.pad(order, (0, slots - order.size(1)), value=2 * length)
    real = order < length
    spare = (~picked).byte().argmax(1, keepdim=True)
    flat = torch.where(real, order, spare) + length * torch.arange(batch).unsqueeze(1)
    return flat.flatten(), real.flatten().float()
