"""ModernBERT's encoder (Warner et al. 2024): rotary positions, pre-LayerNorm without biases,
no linear biases, a GeGLU feed-forward, a final norm, and global attention every
``global_attn_every_n_layers``-th layer (from the first) with a ``local_attention``-token
sliding window elsewhere, each kind with its own RoPE theta.

As transformers' ``ModernBertModel``; its modules here: ``embeddings.{word_embeddings,norm}``
(HF: ``tok_embeddings``; the plugin's name, which GDES and the tied heads read),
``encoder.layer.N.{attn_norm,attn.Wqkv,attn.Wo,mlp_norm,mlp.Wi,mlp.Wo}`` (HF:
``layers.N...``; the first layer has no ``attn_norm``, as in HF) and ``final_norm``. An
embedding size other than the hidden size is projected as ELECTRA does
(``embeddings_project``), which ModernBERT has no slot for. ModernBERT has no token types:
this body reads none (``type_vocab_size`` is set to 0).

The layers run unpadded (:mod:`...speed.unpad`; in a compiled graph on static rows):
outputs at padded positions are zeros.
"""

from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ...speed import Dropout
from ...speed.unpad import Layout
from ...speed.window import keys_per_query
from ..core.config import EncoderSize
from ..core.contract import BatchLayout, Encoder
from ..core.heads import ElectraGeneratorPredictions
from ..core.flops import _DROPOUT, _GELU, _LAYER_NORM, _SOFTMAX
from .base import EncoderBody, full_width_generator, register_body

NORM_EPS = 1e-5  # ModernBERT's norm_eps


def layer_norm(size: int) -> nn.LayerNorm:
    return nn.LayerNorm(size, eps=NORM_EPS, bias=False)


class ModernEmbeddings(nn.Module):
    """Token embeddings, LayerNorm, dropout: no positions, no token types."""

    def __init__(self, vocab_size, embedding_size, padding_idx, dropout,
                 word_embeddings: Optional[nn.Module] = None):
        super().__init__()
        if word_embeddings is None:
            word_embeddings = nn.Embedding(vocab_size, embedding_size, padding_idx=padding_idx)
        self.word_embeddings = word_embeddings
        self.norm = layer_norm(embedding_size)
        self.drop = Dropout(dropout)

    def forward(self, tokens: torch.Tensor, token_types: Optional[torch.Tensor] = None):
        return self.drop(self.norm(self.word_embeddings(tokens)))


def rotary(positions: torch.Tensor, head_dim: int, theta: float):
    """(cos, sin), each N x head_dim, of RoPE at ``positions`` (the two halves of a head
    rotate as pairs, transformers' ``rotate_half`` layout)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float,
                                            device=positions.device) / head_dim)
    angles = positions[:, None].float() * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on x (... x heads x d; cos/sin ... x d), in float32 as transformers does."""
    first, second = x.float().chunk(2, dim=-1)
    turned = torch.cat((-second, first), dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return (x.float() * cos + turned * sin).to(x.dtype)


class ModernAttention(nn.Module):
    def __init__(self, hidden_size, num_heads, attention_dropout, window: Optional[int]):
        super().__init__()
        self.num_heads, self.window = num_heads, window
        self.Wqkv = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        self.Wo = nn.Linear(hidden_size, hidden_size, bias=False)
        self.attention_dropout = attention_dropout
        self.out_drop = Dropout(attention_dropout)

    def forward(self, x, layout: Layout, rope):
        """x: rows of ``layout`` x H -> the same."""
        q, k, v = self.Wqkv(x).unflatten(-1, (3, self.num_heads, -1)).unbind(-3)
        q, k = rotate(q, *rope), rotate(k, *rope)
        out = layout.attention(q, k, v, self.window,
                               self.attention_dropout if self.training else 0.0)
        return self.out_drop(self.Wo(out.flatten(-2)))


class ModernMLP(nn.Module):
    """GeGLU: Wi gives the input and its gate, GELU(input) * gate -> Wo."""

    def __init__(self, hidden_size, ffn_size, dropout):
        super().__init__()
        self.Wi = nn.Linear(hidden_size, 2 * ffn_size, bias=False)
        self.drop = Dropout(dropout)
        self.Wo = nn.Linear(ffn_size, hidden_size, bias=False)

    def forward(self, x):
        value, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.drop(F.gelu(value) * gate))


class ModernLayer(nn.Module):
    def __init__(self, index, hidden_size, num_heads, ffn_size, dropout, attention_dropout,
                 window):
        super().__init__()
        self.attn_norm = nn.Identity() if index == 0 else layer_norm(hidden_size)
        self.attn = ModernAttention(hidden_size, num_heads, attention_dropout, window)
        self.mlp_norm = layer_norm(hidden_size)
        self.mlp = ModernMLP(hidden_size, ffn_size, dropout)

    def forward(self, x, layout, rope):
        x = x + self.attn(self.attn_norm(x), layout, rope)
        return x + self.mlp(self.mlp_norm(x))


class ModernEncoder(nn.Module):
    def __init__(self, layers: List[ModernLayer]):
        super().__init__()
        self.layer = nn.ModuleList(layers)


class ModernPredictionHead(nn.Module):
    """What ModernBERT's task heads run before their classifier: dense -> GELU -> norm,
    without biases (HF: ``head``)."""

    def __init__(self, hidden_size):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size, bias=False)
        self.norm = layer_norm(hidden_size)

    def forward(self, x):
        return self.norm(F.gelu(self.dense(x)))


class ModernTransformer(Encoder):
    """Embeddings (possibly shared) -> optional projection -> ModernBERT layers -> final
    norm. The unpadded rows and the rotary tables are the batch's
    (:meth:`BatchLayout.cached`): built once for both encoders. It reads the padding only."""

    reads_any_mask = False

    def __init__(self, embeddings, size: EncoderSize, dropout, attention_dropout, padding_idx,
                 global_every: int, window: int, global_theta: float, local_theta: float,
                 checkpoint_activations: bool = False):
        super().__init__()
        self.checkpoint_activations = checkpoint_activations
        self.embeddings = embeddings
        self.embeddings_project = (
            nn.Linear(size.embedding, size.hidden) if size.embedding != size.hidden else None)
        # window: the total width, as ModernBERT's local_attention (half on either side)
        self.encoder = ModernEncoder([
            ModernLayer(i, size.hidden, size.heads, size.ffn, dropout, attention_dropout,
                        None if i % global_every == 0 else window // 2)
            for i in range(size.layers)])
        self.final_norm = layer_norm(size.hidden)
        self.padding_idx, self.head_dim = padding_idx, size.hidden // size.heads
        self.thetas = {None: global_theta, "local": local_theta}

    def encode(self, tokens, batch: BatchLayout, token_types=None, return_all_hiddens=False):
        if batch.custom_mask:
            raise ValueError("the modern body reads the padding only, not another attention "
                             "mask")
        x = self.embeddings(tokens)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        # a compiled graph (--graphed-step's fullgraph) takes static rows: no nonzero
        layout = batch.cached("modern unpadded", lambda: Layout(
            batch.padding_mask if batch.has_padding else None, *tokens.shape, tokens.device,
            static=torch.compiler.is_compiling()))
        x = layout.pack(x)
        ropes = {kind: batch.cached(("modern rope", self.head_dim, theta),
                                    lambda theta=theta: rotary(layout.positions, self.head_dim,
                                                               theta))
                 for kind, theta in self.thetas.items()}
        states: List[torch.Tensor] = [layout.unpack(x)] if return_all_hiddens else []
        recompute = self.checkpoint_activations and self.training and torch.is_grad_enabled()
        for layer in self.layers():
            rope = ropes[None if layer.attn.window is None else "local"]
            # recomputed in the backward pass with the same dropout draws (the RNG state
            # is replayed), so the gradients are the ones without checkpointing
            x = checkpoint(layer, x, layout, rope, use_reentrant=False) if recompute else \
                layer(x, layout, rope)
            if return_all_hiddens:
                states.append(layout.unpack(x))
        x = layout.unpack(self.final_norm(x))
        if return_all_hiddens:  # the last state is the output, as transformers gives it
            states[-1] = x
        return x, states


@register_body("modern")
class ModernBody(EncoderBody):
    options = ("global_attn_every_n_layers", "local_attention", "global_rope_theta",
               "local_rope_theta")
    # ModernBERT-base's shape (22 layers, GeGLU inner size 1.5 x hidden); small: ELECTRA-Small's
    archs = {"electra_modern_small": full_width_generator(12, 256, 4, 384),
             "electra_modern_base": full_width_generator(22, 768, 12, 1152)}
    # no position embeddings: the length limit and the global layers' RoPE theta are what
    # ModernBERT's second stage raises (1,024 -> 8,192 tokens, theta 10,000 -> 160,000)
    context_settings = ("max_positions", "global_rope_theta")
    token_types = False
    checkpoints_activations = True

    def embeddings(self, word_embeddings=None) -> ModernEmbeddings:
        return ModernEmbeddings(self.vocab_size, self.cfg.embedding_size, self.padding_idx,
                                self.cfg.dropout, word_embeddings)

    def encoder(self, embeddings, size, generator=False) -> ModernTransformer:
        cfg = self.cfg
        return ModernTransformer(embeddings, size, cfg.dropout, cfg.attention_dropout,
                                 self.padding_idx, cfg.global_attn_every_n_layers,
                                 cfg.local_attention, cfg.global_rope_theta,
                                 cfg.local_rope_theta, cfg.get("checkpoint_activations", False))

    def generator_head(self, hidden_size, embed_tokens):
        """ModernBERT's: dense and norm without biases, the tied decoder with its bias."""
        return ElectraGeneratorPredictions(hidden_size, self.cfg.embedding_size, embed_tokens,
                                           eps=NORM_EPS, biases=False)

    def head_transform(self) -> "ModernPredictionHead":
        return ModernPredictionHead(self.cfg.hidden_size)

    def paper_encoder_flops(self, size, vocab, length, positions, generator=False):
        """The paper's rules on this body: the token lookup, norms without biases, no
        linear biases, RoPE on q and k (6 per value), GeGLU (its doubled input projection,
        GELU on half and the gating product), a local layer's scores against the keys its
        kernel computes (:func:`...speed.window.keys_per_query`: three blocks of half the
        window, or all keys where the window reaches most of the sequence), the final
        norm."""
        e, h, f, n = size.embedding, size.hidden, size.ffn, size.heads
        flops = 2 * e * vocab + (_LAYER_NORM + _DROPOUT) * e + (2 * e * h if e != h else 0)
        for i in range(size.layers):
            keys = length if i % self.cfg.global_attn_every_n_layers == 0 else \
                keys_per_query(length, self.cfg.local_attention // 2)
            flops += (_LAYER_NORM * h * (i > 0) + 2 * h * 3 * h + 6 * 2 * h  # norm, Wqkv, RoPE
                      + 2 * 2 * h * keys + (_SOFTMAX + _DROPOUT + 1) * keys * n  # scores, avg
                      + 2 * h * h + _DROPOUT * h + h  # Wo, dropout, residual
                      + _LAYER_NORM * h + 2 * h * 2 * f + (_GELU + 1 + _DROPOUT) * f
                      + 2 * f * h + h)  # mlp norm, Wi, GELU x gate, dropout, Wo, residual
        return positions * (flops + _LAYER_NORM * h)
