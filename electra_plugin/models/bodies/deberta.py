"""DeBERTa-v2/v3's encoder: no absolute positions; each layer's attention adds to the
content-to-content scores the disentangled content-to-position (c2p) and position-to-content
(p2c) terms over log-bucketed relative positions, scaled by ``sqrt(3 d)``.

As transformers' ``DebertaV2Model`` with DeBERTa-v3's settings (``relative_attention``,
``pos_att_type = p2c|c2p``, ``share_att_key``: the relative embeddings go through the layer's
own query and key projections, ``norm_rel_ebd = layer_norm``, ``position_biased_input``
false, ``position_buckets`` 256 over ``max_positions``, LayerNorm eps 1e-7), with its
module names (``encoder.layer.N.attention.self.query_proj`` ..., ``encoder.rel_embeddings``,
``encoder.LayerNorm``). One difference: an embedding size other than the hidden size is
projected as ELECTRA does (each encoder's ``embeddings_project`` after the embedding
LayerNorm, so that generator and discriminator of different widths share one block), where
``DebertaV2Embeddings`` projects before its LayerNorm. Outputs at padded positions are not
HF's either (HF lets a padded query attend nowhere and zeroes its embedding); every real
token's are.
"""

import math
from typing import List, Optional

import torch
import torch.nn as nn

from ...speed import Dropout, run_layer
from ..core.config import EncoderSize
from ..core.contract import BatchLayout, Encoder
from ..core.encoder import ElectraIntermediate, ElectraResidualOutput
from ..core.heads import ElectraGeneratorPredictions
from ..core.flops import _DROPOUT, _LAYER_NORM, _paper_layer, paper_encoder_flops
from .base import EncoderBody, full_width_generator, register_body

LAYER_NORM_EPS = 1e-7  # DeBERTa-v2/v3's layer_norm_eps
EMD_STEPS = 2  # the enhanced mask decoder's passes of the last layer (official z_steps)
POSITION_BUCKETS = 256  # DeBERTa-v3's position_buckets


def relative_positions(length: int, buckets: int, max_position: int, device=None):
    """T x T bucketed ``i - j`` (query i, key j), as transformers' ``build_relative_position``
    with ``make_log_bucket_position``: exact within ``buckets // 2``, logarithmic beyond up
    to ``max_position``."""
    ids = torch.arange(length, dtype=torch.long, device=device)
    rel = ids[:, None] - ids[None, :]
    sign = torch.sign(rel)
    mid = buckets // 2
    abs_pos = torch.where((rel < mid) & (rel > -mid), torch.tensor(mid - 1).type_as(rel),
                          torch.abs(rel))
    log_pos = torch.ceil(torch.log(abs_pos / mid)
                         / torch.log(torch.tensor((max_position - 1) / mid))
                         * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, rel.type_as(log_pos), log_pos * sign).long()


class DebertaEmbeddings(nn.Module):
    """Token (+ token type) embeddings, LayerNorm, dropout: no absolute positions."""

    def __init__(self, vocab_size, embedding_size, type_vocab_size, padding_idx, dropout,
                 word_embeddings: Optional[nn.Module] = None):
        super().__init__()
        if word_embeddings is None:
            word_embeddings = nn.Embedding(vocab_size, embedding_size, padding_idx=padding_idx)
        self.word_embeddings = word_embeddings
        self.token_type_embeddings = (
            nn.Embedding(type_vocab_size, embedding_size) if type_vocab_size > 0 else None)
        self.LayerNorm = nn.LayerNorm(embedding_size, eps=LAYER_NORM_EPS)
        self.dropout = Dropout(dropout)

    def forward(self, tokens: torch.Tensor, token_types: Optional[torch.Tensor] = None):
        x = self.word_embeddings(tokens)
        if self.token_type_embeddings is not None:
            x = x + (self.token_type_embeddings.weight[0] if token_types is None
                     else self.token_type_embeddings(token_types))
        return self.dropout(self.LayerNorm(x))


class DisentangledSelfAttention(nn.Module):
    """Content-to-content + c2p + p2c scores; the relative embeddings share the content
    query and key projections (``share_att_key``)."""

    def __init__(self, hidden_size, num_heads, dropout, attention_dropout):
        super().__init__()
        self.num_heads = num_heads
        self.query_proj = nn.Linear(hidden_size, hidden_size)
        self.key_proj = nn.Linear(hidden_size, hidden_size)
        self.value_proj = nn.Linear(hidden_size, hidden_size)
        self.pos_dropout = Dropout(dropout)
        self.dropout = Dropout(attention_dropout)

    def heads(self, x):
        """... x T x H -> ... x heads x T x d."""
        return x.unflatten(-1, (self.num_heads, -1)).transpose(-2, -3)

    def forward(self, x, attn_mask, rel_pos, rel_embeddings, query=None):
        """x: B x T x H; attn_mask: bool B x 1 x 1 x T (True = attend) or None; rel_pos:
        T x T bucketed relative positions; rel_embeddings: 2S x H (normalised); query: the
        states the queries come from (default x; the enhanced mask decoder's) -> B x T x H."""
        q = self.heads(self.query_proj(x if query is None else query))
        k, v = self.heads(self.key_proj(x)), self.heads(self.value_proj(x))
        span = rel_embeddings.size(0) // 2
        scale = math.sqrt(q.size(-1) * 3)  # three terms: c2c, c2p, p2c
        scores = q @ (k.transpose(-1, -2) / scale)
        rel = self.pos_dropout(rel_embeddings)
        pos_q, pos_k = self.heads(self.query_proj(rel)), self.heads(self.key_proj(rel))
        index = (rel_pos + span).clamp(0, 2 * span - 1).expand(*q.shape[:2], -1, -1)
        c2p = torch.gather(q @ pos_k.transpose(-1, -2), -1, index)  # q_i . k_r(i-j)
        p2c_index = (span - rel_pos).clamp(0, 2 * span - 1).expand(*q.shape[:2], -1, -1)
        p2c = torch.gather(k @ pos_q.transpose(-1, -2), -1, p2c_index).transpose(-1, -2)
        scores = scores + (c2p / scale + p2c / scale)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, torch.finfo(scores.dtype).min)
        probs = self.dropout(scores.softmax(-1))
        return (probs @ v).transpose(1, 2).flatten(2)


class DebertaAttention(nn.Module):
    def __init__(self, hidden_size, num_heads, dropout, attention_dropout):
        super().__init__()
        setattr(self, "self", DisentangledSelfAttention(hidden_size, num_heads, dropout,
                                                        attention_dropout))
        self.output = ElectraResidualOutput(hidden_size, hidden_size, dropout, LAYER_NORM_EPS)

    def forward(self, x, attn_mask, rel_pos, rel_embeddings, query=None):
        residual = x if query is None else query
        return self.output(getattr(self, "self")(x, attn_mask, rel_pos, rel_embeddings, query),
                           residual)


class DebertaLayer(nn.Module):
    def __init__(self, hidden_size, num_heads, ffn_size, dropout, attention_dropout):
        super().__init__()
        self.attention = DebertaAttention(hidden_size, num_heads, dropout, attention_dropout)
        self.intermediate = ElectraIntermediate(hidden_size, ffn_size)
        self.output = ElectraResidualOutput(ffn_size, hidden_size, dropout, LAYER_NORM_EPS)

    def forward(self, x, attn_mask, rel_pos, rel_embeddings, query=None):
        x = self.attention(x, attn_mask, rel_pos, rel_embeddings, query)
        return self.output(self.intermediate(x), x)


class DebertaEncoder(nn.Module):
    """transformers' ``DebertaV2Encoder``: the layers and the shared relative embeddings."""

    def __init__(self, num_layers, position_buckets, **layer_kwargs):
        super().__init__()
        hidden = layer_kwargs["hidden_size"]
        self.layer = nn.ModuleList(DebertaLayer(**layer_kwargs) for _ in range(num_layers))
        self.rel_embeddings = nn.Embedding(2 * position_buckets, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=LAYER_NORM_EPS)


class DebertaTransformer(Encoder):
    """Embeddings (possibly shared) -> optional projection -> DeBERTa-v2 layers. The relative
    positions are the batch's (:meth:`BatchLayout.cached`): one table for both encoders.

    With ``enhanced_mask_decoder`` (DeBERTa's EMD, the DeBERTa-v3 generator's) the output is
    the last layer's run twice over the states entering it, its queries starting from those
    states plus absolute position embeddings (``position_embeddings``, the only place
    absolute positions enter), the second run's queries from the first's output: the
    official ``EnhancedMaskDecoder`` with ``position_biased_input`` false. The last layer's
    plain pass, which that decoder computes and does not use, is skipped.
    """

    def __init__(self, embeddings, size: EncoderSize, dropout, attention_dropout, padding_idx,
                 max_positions, position_buckets=POSITION_BUCKETS,
                 enhanced_mask_decoder: bool = False):
        super().__init__()
        self.embeddings = embeddings
        self.embeddings_project = (
            nn.Linear(size.embedding, size.hidden) if size.embedding != size.hidden else None)
        self.encoder = DebertaEncoder(
            size.layers, position_buckets, hidden_size=size.hidden, num_heads=size.heads,
            ffn_size=size.ffn, dropout=dropout, attention_dropout=attention_dropout)
        self.padding_idx = padding_idx
        self.max_positions, self.position_buckets = max_positions, position_buckets
        self.position_embeddings = nn.Embedding(max_positions, size.hidden) \
            if enhanced_mask_decoder else None

    def below_layers(self):
        return [*super().below_layers(), self.encoder.rel_embeddings, self.encoder.LayerNorm]

    def encode(self, tokens, layout: BatchLayout, token_types=None, return_all_hiddens=False):
        x = self.embeddings(tokens, token_types)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        setting = (tokens.size(1), self.position_buckets, self.max_positions)
        rel_pos = layout.cached(("deberta relative positions", setting),
                                lambda: relative_positions(*setting, tokens.device))
        rel_embeddings = self.encoder.LayerNorm(self.encoder.rel_embeddings.weight)
        attn_mask = layout.attn_mask
        states: List[torch.Tensor] = [x] if return_all_hiddens else []
        layers = self.layers()
        decoder = self.position_embeddings is not None
        for layer in layers[:-1] if decoder else layers:
            x = run_layer(self, layer, x, attn_mask, rel_pos, rel_embeddings)
            if return_all_hiddens:
                states.append(x)
        if decoder:
            query = x + self.position_embeddings.weight[:tokens.size(1)]
            for _ in range(EMD_STEPS):
                query = layers[-1](x, attn_mask, rel_pos, rel_embeddings, query)
            x = query
            if return_all_hiddens:
                states.append(x)
        return x, states


@register_body("deberta")
class DebertaBody(EncoderBody):
    options = ("position_buckets", "enhanced_mask_decoder")
    archs = {"electra_deberta_small": full_width_generator(12, 256, 4, 1024),
             "electra_deberta_base": full_width_generator(12, 768, 12, 3072)}

    @property
    def position_buckets(self) -> int:
        return self.cfg.get("position_buckets", POSITION_BUCKETS)

    def embeddings(self, word_embeddings=None) -> DebertaEmbeddings:
        cfg = self.cfg
        return DebertaEmbeddings(self.vocab_size, cfg.embedding_size, cfg.type_vocab_size,
                                 self.padding_idx, cfg.dropout, word_embeddings)

    def encoder(self, embeddings, size, generator=False) -> DebertaTransformer:
        cfg = self.cfg
        return DebertaTransformer(embeddings, size, cfg.dropout, cfg.attention_dropout,
                                  self.padding_idx, cfg.max_positions, self.position_buckets,
                                  generator and bool(cfg.get("enhanced_mask_decoder", False)))

    def generator_head(self, hidden_size, embed_tokens):
        return ElectraGeneratorPredictions(hidden_size, self.cfg.embedding_size, embed_tokens,
                                           eps=LAYER_NORM_EPS)

    def paper_encoder_flops(self, size, vocab, length, positions, generator=False):
        """BERT's count by the paper's rules without the position lookup and its add, plus
        per layer the c2p and p2c scores against all 2S relative embeddings, their scaling
        and adds, and, once per sequence, the relative embeddings' LayerNorm and, per layer,
        their dropout and query/key projections."""
        e, h, n, span = size.embedding, size.hidden, size.heads, 2 * self.position_buckets
        positions_lookup = 2 * e * length + e
        per_layer = (2 * 2 * h * span  # q . k_r and k . q_r for every relative embedding
                     + 4 * length * n  # the two terms' 1/sqrt(3d) and their adds
                     + (2 * (2 * h * h + h) + _DROPOUT * h) * span / length)  # per sequence
        per_encoder = _LAYER_NORM * h * span / length  # the relative embeddings' LayerNorm
        flops = paper_encoder_flops(size, vocab, length, positions) + positions * (
            size.layers * per_layer + per_encoder - positions_lookup)
        if generator and self.cfg.get("enhanced_mask_decoder", False):
            # one more pass of the last layer (two for the plain one), the positions' lookup
            # as the paper counts one and their add
            flops += positions * (_paper_layer(size, length) + per_layer + 2 * h * length + h)
        return flops
