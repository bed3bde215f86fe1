"""BERT-style post-LayerNorm Transformer encoder used by both generator and discriminator.

Module names follow HF transformers' ``ElectraModel`` one-to-one (``embeddings.word_embeddings``,
``encoder.layer.N.attention.self.query`` ...) so that checkpoint conversion is a key table,
not a translation layer. Attention runs through ``F.scaled_dot_product_attention`` on GPUs
and where it is fastest on CPU (see :func:`attention`).
"""

import functools
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYER_NORM_EPS = 1e-12


class Dropout(nn.Dropout):
    """``nn.Dropout`` with a cheaper mask on CPU (same module name, no parameters).

    ``F.dropout`` on CPU draws a float Bernoulli sample per element (~6 ns each, the largest
    cost of the step after the matmuls) and keeps that float mask for the backward pass.
    Here each element gets 15 random bits (16-bit lanes of :func:`random_int16`), is kept
    with probability ``round((1 - p) * 2**15) / 2**15`` and the kept values are scaled by
    the inverse of that probability, so the output's expectation is the input exactly. The
    mask is built with integer arithmetic, kept in one byte per element and turned into
    the scaled mask by a bit-and with the scale's bit pattern: comparisons, bool masks and
    int-to-float conversions take slow paths on CPU. CUDA keeps ``F.dropout``'s fused kernel.
    """

    def forward(self, x):
        return dropout(x, self.p, self.training)


def dropout(x, p: float, training: bool):
    """Functional form of :class:`Dropout`."""
    if not training or p == 0.0:
        return x
    keep_below = round((1.0 - p) * 2**15)
    if x.is_cuda or not 0 < keep_below < 2**15:  # 15 bits cannot express this p
        return F.dropout(x, p, training=True)
    return _BitMaskDropout.apply(x, keep_below)


class _BitMaskDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, keep_below):
        # A lane's low 15 bits minus keep_below is negative exactly for kept elements, so
        # the arithmetic shift by 15 leaves -1 (all bits set) where kept and 0 where dropped.
        lanes = random_int16(x.numel()).view(x.shape)
        keep = lanes.bitwise_and_(0x7FFF).sub_(keep_below).bitwise_right_shift_(15)
        ctx.save_for_backward(keep.to(torch.int8))
        ctx.scale = 2**15 / keep_below
        return x * _scaled_mask(keep, x.dtype, ctx.scale)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad * _scaled_mask(keep, grad.dtype, ctx.scale), None


_SAME_SIZE_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _scaled_mask(keep, dtype, scale):
    """-1/0 integer mask -> ``scale``/0 in ``dtype``: -1 & bits(scale) is bits(scale)."""
    as_int = _SAME_SIZE_INT[dtype.itemsize]
    return keep.to(as_int).bitwise_and_(_bits_of(scale, dtype, as_int)).view(dtype)


@functools.lru_cache(maxsize=None)
def _bits_of(value: float, dtype, as_int) -> int:
    return torch.tensor(value, dtype=dtype).view(as_int).item()


# SplitMix64 (Steele, Lea and Flood 2014; Vigna's constants), as two's-complement int64
_GOLDEN = 0x9E3779B97F4A7C15 - 2**64
_MULTIPLIERS = ((30, 0xBF58476D1CE4E5B9 - 2**64), (27, 0x94D049BB133111EB - 2**64))


def random_int16(n: int) -> torch.Tensor:
    """n uniformly random int16 values from SplitMix64 over a counter.

    The counter's seed is drawn from torch's generator, so ``torch.manual_seed`` (and
    fairseq's ``--seed``) make the bits reproducible. torch's CPU ``random_()`` runs the
    Mersenne Twister on one thread at ~2.5 ns per 64-bit value; these dozen whole-tensor
    integer ops run vectorised on every thread, at about half the time or less.
    """
    seed = torch.empty((), dtype=torch.int64).random_().item()
    z = torch.arange((n + 3) // 4, dtype=torch.int64).mul_(_GOLDEN).add_(seed)
    for shift, multiplier in _MULTIPLIERS:
        _xor_shifted_right_(z, shift).mul_(multiplier)
    return _xor_shifted_right_(z, 31).view(torch.int16)[:n]


def _xor_shifted_right_(z, shift):
    """z ^= z >> shift, the shift logical: the arithmetic one, sign-extended bits cleared."""
    return z.bitwise_xor_(z.bitwise_right_shift(shift).bitwise_and_(2 ** (64 - shift) - 1))


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
        # One B x T x 3H projection instead of three: a larger matmul forward and a single
        # one for the input gradient. The weights stay three Linears (checkpoint keys).
        # The softmax scale 1/sqrt(head_dim) is folded into the query's weights, so no pass
        # over q or over the scores forward or backward (exact for power-of-two head sizes).
        scale = (H // self.num_heads) ** -0.5
        weight = torch.cat([self.query.weight * scale, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias * scale, self.key.bias, self.value.bias])
        qkv = F.linear(x, weight, bias).view(B, T, 3, self.num_heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each B x heads x T x head_dim
        out = attention(q, k, v, attn_mask, self.dropout if self.training else 0.0)
        return out.transpose(1, 2).reshape(B, T, H)


def attention(q, k, v, attn_mask, dropout_p: float):
    """Softmax attention, q already scaled; q, k, v: B x heads x T x d, attn_mask as above
    -> B x heads x T x d.

    ``F.scaled_dot_product_attention`` runs fused kernels on CUDA and, on CPU, a flash kernel
    that is the fastest choice in fp32 without dropout. With dropout, CPU SDPA falls back to
    the same math as below plus extra passes (a fully-masked-row check among them), and in
    bf16 its flash kernel is ~3x slower than two bf16 matmuls, so those cases take the plain
    ops.
    """
    if q.is_cuda or (dropout_p == 0.0 and q.dtype == torch.float32):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                              dropout_p=dropout_p, scale=1.0)
    scores = torch.matmul(q, k.transpose(-1, -2))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    probs = dropout(scores.softmax(-1), dropout_p, training=dropout_p > 0)
    return torch.matmul(probs, v)


class ElectraResidualOutput(nn.Module):
    """dense -> dropout -> add residual -> LayerNorm (BERT's post-LN sublayer exit)."""

    def __init__(self, in_size, hidden_size, dropout):
        super().__init__()
        self.dense = nn.Linear(in_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=LAYER_NORM_EPS)
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
        return self.encode(tokens, attention_mask(padding_mask), token_types, return_all_hiddens)

    def encode(self, tokens, attn_mask, token_types=None, return_all_hiddens=False):
        """``forward`` with the mask of :func:`attention_mask` given (computed once per batch)."""
        x = self.embeddings(tokens, token_types)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        states: List[torch.Tensor] = [x] if return_all_hiddens else []
        for layer in self.encoder.layer:
            x = layer(x, attn_mask)
            if return_all_hiddens:
                states.append(x)
        return x, states


def attention_mask(padding_mask):
    """B x T padding mask -> bool B x 1 x 1 x T "may attend" mask over keys, or None.

    None when nothing is padded lets SDPA pick its fastest kernel; checking costs one
    host-device sync, which is why the pre-training step computes it once for both encoders.
    """
    return (~padding_mask)[:, None, None, :] if padding_mask.any() else None
