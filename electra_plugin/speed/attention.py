"""Self-attention's projection and softmax attention, arranged for CPU speed.

Part of :mod:`electra_plugin.speed`; with ``ELECTRA_SPEED=0`` these are three
``nn.Linear`` and ``F.scaled_dot_product_attention``.
"""

import torch
import torch.nn.functional as F

from .dropout import dropout
from .switch import enabled


def project_qkv(attention_module, x):
    """B x T x H -> q, k, v, each B x heads x T x head_dim, q already scaled by
    ``1/sqrt(head_dim)``; ``attention_module`` holds ``query``, ``key``, ``value`` Linears
    and ``num_heads``.

    Fast path: one B x T x 3H projection instead of three (a larger matmul forward and a
    single one for the input gradient; the weights stay three Linears, the checkpoint's
    keys), with the softmax scale folded into the query's weights, so no pass over q or over
    the scores forward or backward (exact for power-of-two head sizes).
    """
    B, T, H = x.shape
    heads = attention_module.num_heads
    scale = (H // heads) ** -0.5
    query, key, value = attention_module.query, attention_module.key, attention_module.value
    if not enabled("qkv"):
        q, k, v = query(x) * scale, key(x), value(x)
        return [t.view(B, T, heads, -1).transpose(1, 2) for t in (q, k, v)]
    weight = torch.cat([query.weight * scale, key.weight, value.weight])
    bias = torch.cat([query.bias * scale, key.bias, value.bias])
    qkv = F.linear(x, weight, bias).view(B, T, 3, heads, -1)
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)


def attention(q, k, v, attn_mask, dropout_p: float):
    """Softmax attention, q already scaled; q, k, v: B x heads x T x d, attn_mask: bool
    B x 1 x 1 x T (True = attend) or None -> B x heads x T x d.

    ``F.scaled_dot_product_attention`` runs fused kernels on CUDA and, on CPU, a flash kernel
    that is the fastest choice in fp32 without dropout. With dropout, CPU SDPA falls back to
    the same math as below plus extra passes (a fully-masked-row check among them), and in
    bf16 its flash kernel is ~3x slower than two bf16 matmuls, so those cases take the plain
    ops (and :func:`~electra_plugin.speed.dropout.dropout`'s cheaper mask).
    """
    if q.is_cuda or not enabled("attention") or (dropout_p == 0.0 and q.dtype == torch.float32):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                              dropout_p=dropout_p, scale=1.0)
    scores = torch.matmul(q, k.transpose(-1, -2))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    probs = dropout(scores.softmax(-1), dropout_p, training=dropout_p > 0)
    return torch.matmul(probs, v)
