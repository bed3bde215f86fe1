"""Output heads on top of the encoders. Names follow HF transformers' ELECTRA classes."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .encoder import LAYER_NORM_EPS


class GeneratorHead(nn.Module):
    """Masked-LM head: dense -> GELU -> LayerNorm -> projection tied to the token embeddings.

    Called on the generator's hidden states at the masked positions only (M x H_gen), so the
    vocabulary projection costs M x V instead of B x T x V.
    """

    def __init__(self, hidden_size, embedding_size, embed_tokens: nn.Embedding):
        super().__init__()
        self.dense = nn.Linear(hidden_size, embedding_size)
        self.LayerNorm = nn.LayerNorm(embedding_size, eps=LAYER_NORM_EPS)
        self.embed_tokens = [embed_tokens]  # a list keeps it out of this module's state_dict
        self.bias = nn.Parameter(torch.zeros(embed_tokens.num_embeddings))

    def forward(self, hidden):
        """hidden: M x H_gen -> M x V logits."""
        x = self.LayerNorm(F.gelu(self.dense(hidden)))
        return F.linear(x, self.embed_tokens[0].weight, self.bias)


class DiscriminatorHead(nn.Module):
    """Per-token replaced/original classifier: dense -> GELU -> dense to one logit."""

    def __init__(self, hidden_size):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dense_prediction = nn.Linear(hidden_size, 1)

    def forward(self, hidden):
        """hidden: B x T x H -> B x T logits (> 0 means "replaced")."""
        return self.dense_prediction(F.gelu(self.dense(hidden))).squeeze(-1)
