"""BERT-style post-LayerNorm Transformer encoder used by both generator and discriminator.

Module names follow HF transformers' ``ElectraModel`` one-to-one (``embeddings.word_embeddings``,
``encoder.layer.N.attention.self.query`` ...) so that checkpoint conversion is a key table,
not a translation layer. Dropout, the q/k/v projection and attention come from
:mod:`electra_plugin.speed`, which computes what ``nn.Dropout``, three ``nn.Linear`` and
``F.scaled_dot_product_attention`` compute, faster on CPU (``ELECTRA_SPEED=0``: those ops).
"""

from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...speed import Dropout, attention, project_qkv, run_layer
from .config import EncoderSize
from .contract import BatchLayout, Encoder

LAYER_NORM_EPS = 1e-12


class ElectraEmbeddings(nn.Module):
    """Token + learned position (+ token type) embeddings, LayerNorm, dropout.

    One instance may be shared by the generator and the discriminator; with GDES the
    discriminator's has its own except for ``word_embeddings`` (a :class:`DisentangledEmbedding`).
    """

    def __init__(self, vocab_size, embedding_size, max_positions, type_vocab_size,
                 padding_idx, dropout, word_embeddings: Optional[nn.Module] = None):
        super().__init__()
        if word_embeddings is None:
            word_embeddings = nn.Embedding(vocab_size, embedding_size, padding_idx=padding_idx)
        self.word_embeddings = word_embeddings
        self.position_embeddings = nn.Embedding(max_positions, embedding_size)
        self.token_type_embeddings = (
            nn.Embedding(type_vocab_size, embedding_size) if type_vocab_size > 0 else None
        )
        self.LayerNorm = nn.LayerNorm(embedding_size, eps=LAYER_NORM_EPS)
        self.dropout = Dropout(dropout)

    def forward(self, tokens: torch.Tensor, token_types: Optional[torch.Tensor] = None):
        """tokens: B x T -> B x T x E. Positions count from 0 at the first token."""
        positions = self.position_embeddings(torch.arange(tokens.size(1), device=tokens.device))
        if self.token_type_embeddings is not None:
            if token_types is None:
                # Row 0 of the table, added to the T x E positions rather than to B x T x E.
                positions = positions + self.token_type_embeddings.weight[0]
            else:
                positions = positions + self.token_type_embeddings(token_types)
        return self.dropout(self.LayerNorm(self.word_embeddings(tokens) + positions))


class DisentangledEmbedding(nn.Module):
    """Gradient-disentangled embedding sharing (GDES, DeBERTa-v3): ``stop_gradient(E) + delta``.

    E is the generator's token embedding table, so the discriminator reads it without pulling
    it towards its own objective (only the generator's MLM loss trains E), while ``delta``,
    zero at the start and the discriminator's own, lets the discriminator adjust it.
    """

    def __init__(self, shared: nn.Embedding):
        super().__init__()
        self.shared = [shared]  # a list keeps the generator's table out of this state_dict
        self.delta = nn.Parameter(torch.zeros_like(shared.weight))
        self.num_embeddings = shared.num_embeddings
        self.padding_idx = shared.padding_idx

    @property
    def weight(self) -> torch.Tensor:
        """The table the discriminator sees (also what its MLM head of replace_mlm ties to)."""
        return self.shared[0].weight.detach() + self.delta

    def forward(self, tokens):
        return F.embedding(tokens, self.weight, self.padding_idx)


class ElectraSelfAttention(nn.Module):
    def __init__(self, hidden_size, num_heads, dropout):
        super().__init__()
        self.num_heads = num_heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.dropout = dropout

    def forward(self, x, attn_mask):
        """x: B x T x H, attn_mask: bool B x 1 x 1 x T (True = attend) or None -> B x T x H."""
        B, T, H = x.shape
        q, k, v = project_qkv(self, x)  # each B x heads x T x head_dim
        out = attention(q, k, v, attn_mask, self.dropout if self.training else 0.0)
        return out.transpose(1, 2).reshape(B, T, H)


class ElectraResidualOutput(nn.Module):
    """dense -> dropout -> add residual -> LayerNorm (BERT's post-LN sublayer exit)."""

    def __init__(self, in_size, hidden_size, dropout, eps=LAYER_NORM_EPS):
        super().__init__()
        self.dense = nn.Linear(in_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps)
        self.dropout = Dropout(dropout)

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class ElectraAttention(nn.Module):
    def __init__(self, hidden_size, num_heads, dropout, attention_dropout):
        super().__init__()
        setattr(self, "self", ElectraSelfAttention(hidden_size, num_heads, attention_dropout))
        self.output = ElectraResidualOutput(hidden_size, hidden_size, dropout)

    def forward(self, x, attn_mask):
        return self.output(getattr(self, "self")(x, attn_mask), x)


class ElectraIntermediate(nn.Module):
    def __init__(self, hidden_size, ffn_size):
        super().__init__()
        self.dense = nn.Linear(hidden_size, ffn_size)

    def forward(self, x):
        return F.gelu(self.dense(x))


class ElectraLayer(nn.Module):
    def __init__(self, hidden_size, num_heads, ffn_size, dropout, attention_dropout):
        super().__init__()
        self.attention = ElectraAttention(hidden_size, num_heads, dropout, attention_dropout)
        self.intermediate = ElectraIntermediate(hidden_size, ffn_size)
        self.output = ElectraResidualOutput(ffn_size, hidden_size, dropout)

    def forward(self, x, attn_mask):
        x = self.attention(x, attn_mask)
        return self.output(self.intermediate(x), x)


class ElectraEncoder(nn.Module):
    """transformers' ``ElectraEncoder``: the layers."""

    def __init__(self, num_layers, **layer_kwargs):
        super().__init__()
        self.layer = nn.ModuleList(ElectraLayer(**layer_kwargs) for _ in range(num_layers))


class ElectraTransformer(Encoder):
    """Embeddings (possibly shared) -> optional projection -> post-LN Transformer layers.

    transformers' ``ElectraModel``, with its parts' names (``embeddings``,
    ``embeddings_project``, ``encoder.layer``); that class name is the fairseq model's here,
    as fairseq names its registered models."""

    def __init__(self, embeddings: ElectraEmbeddings, size: EncoderSize, dropout,
                 attention_dropout, padding_idx):
        super().__init__()
        self.embeddings = embeddings
        self.embeddings_project = (
            nn.Linear(size.embedding, size.hidden) if size.embedding != size.hidden else None
        )
        self.encoder = ElectraEncoder(
            size.layers, hidden_size=size.hidden, num_heads=size.heads, ffn_size=size.ffn,
            dropout=dropout, attention_dropout=attention_dropout,
        )
        self.padding_idx = padding_idx

    def encode(self, tokens, layout: BatchLayout, token_types=None, return_all_hiddens=False):
        x = self.embeddings(tokens, token_types)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        states: List[torch.Tensor] = [x] if return_all_hiddens else []
        for layer in self.layers():
            x = run_layer(self, layer, x, layout.attn_mask)
            if return_all_hiddens:
                states.append(x)
        return x, states
