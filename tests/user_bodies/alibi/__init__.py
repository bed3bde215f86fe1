"""An encoder body of one's own, loaded with ``--user-dir``: BERT's post-LayerNorm layers with
ALiBi (Press et al., 2022) in place of position embeddings: each head adds ``-slope * |i - j|``
to its attention scores, the slopes a geometric series from 2^(-8/heads). No token types.

This file and its registration are the whole body: the tests train it through
fairseq-train, resume it, fine-tune it with every kind and see its export refused (it
declares no transformers family)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from electra_plugin.models.bodies import EncoderBody, register_body
from electra_plugin.models.core.contract import BatchLayout, Encoder


def alibi_bias(heads: int, length: int, device) -> torch.Tensor:
    """heads x T x T: ``-slope_h * |i - j|``."""
    slopes = torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)], device=device)
    ids = torch.arange(length, device=device)
    return -slopes[:, None, None] * (ids[:, None] - ids[None, :]).abs()


class AlibiEmbeddings(nn.Module):
    def __init__(self, vocab_size, embedding_size, padding_idx, dropout, word_embeddings=None):
        super().__init__()
        self.word_embeddings = word_embeddings if word_embeddings is not None else \
            nn.Embedding(vocab_size, embedding_size, padding_idx=padding_idx)
        self.LayerNorm = nn.LayerNorm(embedding_size, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens, token_types=None):
        return self.dropout(self.LayerNorm(self.word_embeddings(tokens)))


class AlibiLayer(nn.Module):
    """Post-LayerNorm: x = LN(x + attention(x)), then x = LN(x + feed-forward(x))."""

    def __init__(self, hidden, heads, ffn, dropout, attention_dropout):
        super().__init__()
        self.heads, self.attention_dropout = heads, attention_dropout
        self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.attention_LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.ffn = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))
        self.output_LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, bias):
        B, T, H = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias.to(q.dtype),
            dropout_p=self.attention_dropout if self.training else 0.0)
        x = self.attention_LayerNorm(x + self.dropout(self.out(a.transpose(1, 2).reshape(B, T, H))))
        return self.output_LayerNorm(x + self.dropout(self.ffn(x)))


class AlibiTransformer(Encoder):
    def __init__(self, embeddings, size, dropout, attention_dropout, padding_idx):
        super().__init__()
        self.embeddings, self.padding_idx, self.heads = embeddings, padding_idx, size.heads
        self.embeddings_project = nn.Linear(size.embedding, size.hidden) \
            if size.embedding != size.hidden else None
        self.layer = nn.ModuleList(
            AlibiLayer(size.hidden, size.heads, size.ffn, dropout, attention_dropout)
            for _ in range(size.layers))

    def layers(self):
        return self.layer

    def encode(self, tokens, layout: BatchLayout, token_types=None, return_all_hiddens=False):
        x = self.embeddings(tokens)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        # a float mask: the bias, and -inf where the layout's mask forbids
        mask = layout.cached(("alibi", self.heads, tokens.size(1)), lambda: self._mask(
            layout.attn_mask, tokens.size(1), x.device))
        states = [x] if return_all_hiddens else []
        for layer in self.layer:
            x = layer(x, mask)
            if return_all_hiddens:
                states.append(x)
        return x, states

    def _mask(self, attn_mask, length, device):
        bias = alibi_bias(self.heads, length, device)[None]
        return bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))


@register_body("alibi")
class AlibiBody(EncoderBody):
    token_types = False

    def embeddings(self, word_embeddings=None):
        return AlibiEmbeddings(self.vocab_size, self.cfg.embedding_size, self.padding_idx,
                               self.cfg.dropout, word_embeddings)

    def encoder(self, embeddings, size, generator=False):
        return AlibiTransformer(embeddings, size, self.cfg.dropout, self.cfg.attention_dropout,
                                self.padding_idx)

