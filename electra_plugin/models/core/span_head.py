"""Span extraction head for SQuAD: start/end logits per token, and a no-answer logit."""

from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

# The official head's hidden width for the joint end logits and the answerable classifier
# that reads the start probabilities (google-research/electra finetune/qa/qa_tasks.py).
JOINT_HIDDEN = 512
# what the official code adds to the logits of positions outside the context
MASKED = -1000.0


class SpanLogits(NamedTuple):
    """What the span head returns (a tuple, so DDP can walk it)."""

    start: torch.Tensor  # B x T
    end: torch.Tensor  # B x T; joint prediction without gold starts: B x K x T, K = beam
    no_answer: Optional[torch.Tensor]  # B, > 0 means "no answer in this window"; None for 1.1
    start_top: Optional[torch.Tensor] = None  # B x K: the starts the end logits are for


class SpanHead(nn.Module):
    """One linear layer to (start, end) logits per token, as the official BERT/ELECTRA code
    (and HF's ElectraForQuestionAnswering).

    ``out_proj`` is what the model's checkpoint head rules read the head's size from. With
    ``answerable`` (SQuAD 2.0) a classifier on the first token (``<s>``) gives a logit that
    the window holds no answer: dense -> GELU -> dropout -> linear on its features, or with
    ``answerable_uses_start_logits`` (official) on them concatenated with the features
    averaged under the start probabilities. With ``joint_prediction`` (official) the end
    logits are conditioned on a start: a GELU layer over [start features, token features];
    training reads the gold start, inference the ``beam_size`` most likely starts; start
    logits are then kept to the context (and ``<s>``), as the official answer mask does.
    Every layer starts Glorot-uniform, as the official ``tf.layers.dense`` kernels
    (``glorot``, read by the model's ``add_head``).
    """

    glorot = ("out_proj", "end_dense", "end_proj", "no_answer_dense", "no_answer_proj")

    def __init__(self, hidden_size: int, answerable: bool, dropout: float = 0.1,
                 joint_prediction: bool = False, beam_size: int = 20,
                 answerable_uses_start_logits: bool = False,
                 transform: Optional[nn.Module] = None):
        super().__init__()
        self.transform = transform  # a body's layer before the heads (ModernBERT's)
        self.joint = joint_prediction
        self.beam_size = beam_size
        self.out_proj = nn.Linear(hidden_size, 1 if joint_prediction else 2)
        if joint_prediction:
            self.end_dense = nn.Linear(2 * hidden_size, JOINT_HIDDEN)
            self.end_proj = nn.Linear(JOINT_HIDDEN, 1)
        self.uses_start = answerable and answerable_uses_start_logits
        self.no_answer_dense = self.no_answer_proj = None
        if answerable:
            inner = JOINT_HIDDEN if self.uses_start else hidden_size
            self.no_answer_dense = nn.Linear(hidden_size * (2 if self.uses_start else 1),
                                             inner)
            self.no_answer_proj = nn.Linear(inner, 1)
        self.dropout = nn.Dropout(dropout)

    @property
    def answerable(self) -> bool:
        return self.no_answer_proj is not None

    def forward(self, features: torch.Tensor, padding_mask: Optional[torch.Tensor] = None,
                token_types: Optional[torch.Tensor] = None,
                start_positions: Optional[torch.Tensor] = None, **_) -> SpanLogits:
        """features: B x T x H discriminator output; token_types and padding_mask give the
        positions an answer may take (:func:`answer_context`), needed by the official
        variants; start_positions: B gold starts (training the joint end logits) ->
        :class:`SpanLogits`."""
        context = None
        if token_types is not None:
            padding = torch.zeros_like(token_types, dtype=torch.bool) if padding_mask is None \
                else padding_mask
            context = answer_context(token_types, padding)
        if context is None:  # no segments given: any position
            context = torch.ones(features.shape[:2], dtype=torch.bool, device=features.device)
        if self.transform is not None:
            features = self.transform(features)
        if not self.joint:
            start, end = self.out_proj(features).unbind(-1)
        else:
            start = self.out_proj(features).squeeze(-1) + MASKED * (~context)
        start_top = None
        if self.joint:
            if start_positions is not None:  # teacher forcing: the gold start's features
                starts = start_positions[:, None]
            else:
                k = min(self.beam_size, start.size(1))
                starts = start.float().log_softmax(-1).topk(k, dim=-1).indices
                start_top = starts
            picked = features.gather(1, starts[..., None].expand(-1, -1, features.size(-1)))
            pairs = torch.cat([picked[:, :, None].expand(-1, -1, features.size(1), -1),
                               features[:, None].expand(-1, starts.size(1), -1, -1)], -1)
            end = self.end_proj(F.gelu(self.end_dense(pairs))).squeeze(-1)
            end = end + MASKED * (~context[:, None])
            if start_positions is not None:
                end = end.squeeze(1)
        no_answer = None
        if self.answerable:
            x = features[:, 0]
            if self.uses_start:
                allowed = start if self.joint else start + MASKED * (~context)
                weights = allowed.float().softmax(-1).type_as(features)
                x = torch.cat([x, torch.einsum("bt,bth->bh", weights, features)], -1)
            x = self.dropout(F.gelu(self.no_answer_dense(x)))
            no_answer = self.no_answer_proj(x).squeeze(-1)
        return SpanLogits(start, end, no_answer, start_top)


def answer_context(token_types: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """B x T bool: where an answer may start or end, the official answer mask: the second
    segment's real tokens (the context and its closing ``</s>``) and the first token."""
    context = token_types.eq(1) & ~padding
    context[:, 0] = True
    return context
