"""Electric's noise distribution (Clark et al., EMNLP 2020): a two-tower cloze model that
gives q(x_t | the other tokens) at every token in one pass over the original tokens.

A left-to-right and a right-to-left encoder of the generator's size read the uncorrupted
input; position t takes the left tower's state at t - 1 (which has seen x_<t) and the right
tower's at t + 1 (x_>t), so q_t never sees x_t. The official code's ``two_tower_generator``
(``run_pretraining.py``), trained by cross-entropy on every ordinary token.
"""

import dataclasses
import math

import torch
import torch.nn.functional as F

from ...user_io.errors import ElectraUsageError
from ..core.flops import paper_generator_output
from ..core.heads import ElectraGeneratorPredictions
from .base import register_generator_kind
from .masked_lm import MaskedLMGenerator

MASK_PROB = 0.15  # the electra task's default --mask-prob, for a model built without a run


def directional_masks(attn_mask, length: int, device):
    """(left-to-right, right-to-left) "may attend" masks: the padding mask ``attn_mask``
    (B x 1 x 1 x T, or None) and j <= i, resp. j >= i. A query may always attend itself, so
    that a padding position's row is never empty (the softmax of an empty row is NaN)."""
    left = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    if attn_mask is None:
        return left, left.T
    itself = torch.eye(length, dtype=torch.bool, device=device)
    return (left & attn_mask) | itself, (left.T & attn_mask) | itself


@register_generator_kind("two_tower")
class TwoTowerGenerator(MaskedLMGenerator):
    """Both towers share the token embeddings with the discriminator (the official default)
    and each has its own projection; the cloze head (dense over both states, GELU,
    LayerNorm, output tied to the token embeddings) runs at every position."""

    embedding_sharing = ("shared",)
    objectives = ("electric",)
    cloze = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.mask_prob = MASK_PROB

    def complete_run(self, run):
        self.mask_prob = run.get("task", {}).get("mask_prob", MASK_PROB)

    @property
    def noise_log_odds(self) -> float:
        """log(k / (n - k)): the prior log-odds that a token is noise, as the official
        code's log(mask_prob / (1 - mask_prob))."""
        return math.log(self.mask_prob / (1 - self.mask_prob))

    def build(self, model, dictionary, shared_embeddings):
        size = self.size()
        model.generator_ltr = model.make_encoder(shared_embeddings, size)
        model.generator_rtl = model.make_encoder(shared_embeddings, size)
        if not model.generator_ltr.reads_any_mask:
            raise ElectraUsageError(
                f"--generator two_tower reads each tower in one direction, an attention mask "
                f"--encoder-body {model.body.name} does not read (it attends by padding "
                f"only); use --encoder-body bert or deberta")
        model.cloze_head = ElectraGeneratorPredictions(
            2 * size.hidden, self.cfg.embedding_size, shared_embeddings.word_embeddings)
        # what the masking never picks: the cloze loss leaves them out, as the official
        self.specials = (dictionary.bos(), dictionary.eos(), dictionary.pad(),
                         dictionary.index("<mask>"))

    def propose(self, model, src_tokens, layout, positions, token_types=None):
        ltr_mask, rtl_mask = directional_masks(layout.attn_mask, src_tokens.size(1),
                                               src_tokens.device)
        ltr, _ = model.generator_ltr.encode(src_tokens, layout.with_attn_mask(ltr_mask),
                                            token_types)
        rtl, _ = model.generator_rtl.encode(src_tokens, layout.with_attn_mask(rtl_mask),
                                            token_types)
        # shifted by one, zeros at the ends (the official roll wraps around, which would
        # show the last token the right tower's first state, which has read it)
        hidden = torch.cat([F.pad(ltr[:, :-1], (0, 0, 1, 0)), F.pad(rtl[:, 1:], (0, 0, 0, 1))],
                           dim=-1)
        return F.log_softmax(model.cloze_head(hidden), dim=-1, dtype=torch.float32), None

    def ordinary(self, tokens):
        """B x T bool: the tokens the masking may pick (not <s>, </s>, <pad>, <mask>)."""
        ordinary = torch.ones_like(tokens, dtype=torch.bool)
        for special in self.specials:
            ordinary &= tokens.ne(special)
        return ordinary

    def trained_loss(self, out, per_token):
        """Cross-entropy of q on every ordinary token (not only the masked ones)."""
        log_q = out.noise_log_probs.gather(-1, out.original[..., None]).squeeze(-1)
        ordinary = self.ordinary(out.original)
        return -log_q.masked_fill(~ordinary, 0.0).sum() / ordinary.sum().clamp(min=1)

    def paper_flops(self, model, vocab, length, positions, predicted):
        """Both towers and the cloze head at every position, forward and backward."""
        size = self.network_size
        head = dataclasses.replace(size, hidden=2 * size.hidden)  # reads both towers
        return 2 * (2 * model.body.paper_encoder_flops(size, vocab, length, positions)
                    + positions * paper_generator_output(head, vocab))
