"""BERT-style post-LayerNorm Transformer encoder used by both generator and discriminator.

Module names follow HF transformers' ``ElectraModel`` one-to-one (``embeddings.word_embeddings``,
``encoder.layer.N.attention.self.query`` ...) so that checkpoint conversion is a key table,
not a translation layer. Attention runs through ``F.scaled_dot_product_attention``.
"""

from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYER_NORM_EPS = 1e-12


class ElectraEmbeddings(nn.Module):
    """Token + learned position (+ token type) embeddings, LayerNorm, dropout.

    One instance may be shared by the generator and the discriminator.
    """

    def __init__(self, vocab_size, embedding_size, max_positions, type_vocab_size,
                 padding_idx, dropout):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, embedding_size, padding_idx=padding_idx)
        self.position_embeddings = nn.Embedding(max_positions, embedding_size)
        self.token_type_embeddings = (
            nn.Embedding(type_vocab_size, embedding_size) if type_vocab_size > 0 else None
        )
        self.LayerNorm = nn.LayerNorm(embedding_size, eps=LAYER_NORM_EPS)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor, token_types: Optional[torch.Tensor] = None):
        """tokens: B x T -> B x T x E. Positions count from 0 at the first token."""
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.word_embeddings(tokens) + self.position_embeddings(positions)
        if self.token_type_embeddings is not None:
            if token_types is None:
                # Row 0 of the table, without materialising a B x T index tensor.
                x = x + self.token_type_embeddings.weight[0]
            else:
                x = x + self.token_type_embeddings(token_types)
        return self.dropout(self.LayerNorm(x))


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
        split = lambda t: t.view(B, T, self.num_heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0
        )
        return out.transpose(1, 2).reshape(B, T, H)


class ElectraResidualOutput(nn.Module):
    """dense -> dropout -> add residual -> LayerNorm (BERT's post-LN sublayer exit)."""

    def __init__(self, in_size, hidden_size, dropout):
        super().__init__()
        self.dense = nn.Linear(in_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=LAYER_NORM_EPS)
        self.dropout = nn.Dropout(dropout)

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


class ElectraLayerStack(nn.Module):
    def __init__(self, num_layers, **layer_kwargs):
        super().__init__()
        self.layer = nn.ModuleList(ElectraLayer(**layer_kwargs) for _ in range(num_layers))


class ElectraEncoder(nn.Module):
    """Embeddings (possibly shared) -> optional projection -> post-LN Transformer layers."""

    def __init__(self, embeddings: ElectraEmbeddings, embedding_size, hidden_size, num_layers,
                 num_heads, ffn_size, dropout, attention_dropout, padding_idx):
        super().__init__()
        self.embeddings = embeddings
        self.embeddings_project = (
            nn.Linear(embedding_size, hidden_size) if embedding_size != hidden_size else None
        )
        self.encoder = ElectraLayerStack(
            num_layers, hidden_size=hidden_size, num_heads=num_heads, ffn_size=ffn_size,
            dropout=dropout, attention_dropout=attention_dropout,
        )
        self.padding_idx = padding_idx

    def forward(self, tokens, token_types=None, padding_mask=None, return_all_hiddens=False):
        """tokens: B x T -> (B x T x H last hidden state, list of every layer's B x T x H).

        The list holds the projected embeddings then each layer's output when
        ``return_all_hiddens`` is set, and is empty otherwise.
        """
        if padding_mask is None:
            padding_mask = tokens.eq(self.padding_idx)
        # Boolean "may attend" mask over keys; None lets SDPA pick its fastest kernel.
        attn_mask = (~padding_mask)[:, None, None, :] if padding_mask.any() else None
        x = self.embeddings(tokens, token_types)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        states: List[torch.Tensor] = [x] if return_all_hiddens else []
        for layer in self.encoder.layer:
            x = layer(x, attn_mask)
            if return_all_hiddens:
                states.append(x)
        return x, states
