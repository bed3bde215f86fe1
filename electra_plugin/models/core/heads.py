"""Output heads on top of the encoders. Names follow HF transformers' ELECTRA classes.

The pre-training heads compute in fp32 whatever the weights' dtype (``--fp16``/``--bf16``) or
an active autocast: their outputs feed the losses, the sampling and the metrics, and half
precision ties them (a collapsed batch's replaced-token logits, all within ~0.003 of one
value, gave disc_auc 0.6475 in fp32 and exactly 0.5 in bf16). They are a small part of the
step (the discriminator head is 1/(12 L) of the encoder's matmuls, the generator's vocabulary
projection runs at the masked positions only).
"""

from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .encoder import LAYER_NORM_EPS


class HeadSettings(NamedTuple):
    """What a task head is built from: the encoder's width, the dropout, and the body's own
    layer before the heads (ModernBERT's dense + norm; a new module each time; None for
    BERT's and DeBERTa's)."""

    hidden_size: int
    dropout: float
    transform: Optional[nn.Module]


def fp32_linear(x, weight, bias=None):
    """``F.linear`` in fp32, outside any autocast, on fp32 copies of half-precision inputs."""
    with torch.autocast(x.device.type, enabled=False):
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float())


class ElectraGeneratorPredictions(nn.Module):
    """Masked-LM head: dense -> GELU -> LayerNorm -> projection tied to the token embeddings.

    Called on the generator's hidden states at the masked positions only (M x H_gen), so the
    vocabulary projection costs M x V instead of B x T x V; that projection runs in fp32.
    """

    def __init__(self, hidden_size, embedding_size, embed_tokens: nn.Embedding,
                 eps: float = LAYER_NORM_EPS, biases: bool = True):
        super().__init__()
        self.dense = nn.Linear(hidden_size, embedding_size, bias=biases)
        self.LayerNorm = nn.LayerNorm(embedding_size, eps=eps, bias=biases)
        self.embed_tokens = [embed_tokens]  # a list keeps it out of this module's state_dict
        self.bias = nn.Parameter(torch.zeros(embed_tokens.num_embeddings))

    def forward(self, hidden):
        """hidden: M x H_gen -> M x V fp32 logits."""
        x = self.LayerNorm(F.gelu(self.dense(hidden)))
        return fp32_linear(x, self.embed_tokens[0].weight, self.bias)


class ElectraDiscriminatorPredictions(nn.Module):
    """Per-token replaced/original classifier: dense -> GELU -> dense to one logit, in fp32."""

    def __init__(self, hidden_size):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dense_prediction = nn.Linear(hidden_size, 1)

    def forward(self, hidden):
        """hidden: B x T x H -> B x T fp32 logits (> 0 means "replaced")."""
        x = F.gelu(fp32_linear(hidden, self.dense.weight, self.dense.bias))
        return fp32_linear(x, self.dense_prediction.weight, self.dense_prediction.bias).squeeze(-1)


class ElectraClassificationHead(nn.Module):
    """Sentence-level head, as HF's ELECTRA classifier on the first token (``<s>``/[CLS]).

    dropout -> dense -> GELU -> dropout -> out_proj; keys map to HF's ``classifier.*``. A
    body's ``transform`` (ModernBERT's prediction head) takes the place of dense -> GELU.
    ``pooling="mean"`` reads the mean of the non-pad tokens' features instead: a
    discriminator pre-trained briefly leaves ``<s>`` (always "original") input-independent,
    while every other token had to be told apart.
    """

    def __init__(self, hidden_size, inner_dim, num_classes, dropout, pooling="first",
                 transform: Optional[nn.Module] = None):
        super().__init__()
        if transform is None:
            self.dense = nn.Linear(hidden_size, inner_dim)
        else:
            self.transform, inner_dim = transform, hidden_size
        self.out_proj = nn.Linear(inner_dim, num_classes)
        self.dropout = nn.Dropout(dropout)
        self.pooling = pooling

    def forward(self, features, padding_mask=None, **_):
        """features: B x T x H (padding_mask: B x T, True at padding) -> B x C."""
        if self.pooling == "mean":
            keep = (~padding_mask).unsqueeze(-1).to(features.dtype)
            x = (features * keep).sum(1) / keep.sum(1).clamp(min=1)
        else:
            x = features[:, 0]
        x = self.dropout(x)
        x = self.transform(x) if hasattr(self, "transform") else F.gelu(self.dense(x))
        return self.out_proj(self.dropout(x))


class ElectraTokenClassificationHead(nn.Module):
    """Per-token head, as HF's ElectraForTokenClassification: dropout -> out_proj (HF's
    ``classifier``) on every token's features (after a body's ``transform``, as
    ModernBERT's); B x T x H -> B x T x C."""

    def __init__(self, hidden_size, num_labels, dropout, transform: Optional[nn.Module] = None):
        super().__init__()
        self.transform = transform
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(hidden_size, num_labels)

    def forward(self, features, **_):
        if self.transform is not None:
            features = self.transform(features)
        return self.out_proj(self.dropout(features))
