"""Span extraction head for SQuAD: start/end logits per token, and a no-answer logit."""

from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


class SpanLogits(NamedTuple):
    """What the span head returns (a tuple, so DDP can walk it)."""

    start: torch.Tensor  # B x T
    end: torch.Tensor  # B x T
    no_answer: Optional[torch.Tensor]  # B, > 0 means "no answer in this window"; None for 1.1


class SpanHead(nn.Module):
    """One linear layer to (start, end) logits per token, as the official BERT/ELECTRA code.

    ``out_proj`` (H -> 2) is what the model's checkpoint head rules read the head's size
    from. With ``answerable`` (SQuAD 2.0) a classifier on the first token (``<s>``),
    dense -> GELU -> dropout -> linear, gives a logit that the window holds no answer (the
    official ELECTRA ``answerable_classifier``, without its optional start-probability
    features).
    """

    def __init__(self, hidden_size: int, answerable: bool, dropout: float = 0.1):
        super().__init__()
        self.out_proj = nn.Linear(hidden_size, 2)
        self.no_answer_dense = self.no_answer_proj = None
        if answerable:
            self.no_answer_dense = nn.Linear(hidden_size, hidden_size)
            self.no_answer_proj = nn.Linear(hidden_size, 1)
        self.dropout = nn.Dropout(dropout)

    @property
    def answerable(self) -> bool:
        return self.no_answer_proj is not None

    def forward(self, features: torch.Tensor) -> SpanLogits:
        """features: B x T x H discriminator output -> :class:`SpanLogits`."""
        start, end = self.out_proj(features).unbind(-1)
        no_answer = None
        if self.answerable:
            x = self.dropout(F.gelu(self.no_answer_dense(features[:, 0])))
            no_answer = self.no_answer_proj(x).squeeze(-1)
        return SpanLogits(start, end, no_answer)
