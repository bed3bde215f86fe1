"""Global attention on CPU without keeping the T x T matrix for the backward pass.

Part of :mod:`electra_plugin.speed`. CPU ``F.scaled_dot_product_attention`` has a flash
kernel that keeps only q, k, v, the output and each row's log-sum-exp, but it takes no
dropout: with attention dropout it runs the math fallback, which keeps three float T x T
tensors per head for the backward pass (the softmax, the dropout's multiplier and the
dropped probabilities; 19.6 GB of a 8,192-token step at Small widths), and a T x T padding
mask, which the flash kernel keeps as floats. Here

- without dropout, the flash kernel runs with the padding as a B x 1 x 1 x T key mask;
- with dropout, :func:`chunked_attention`: the queries go in chunks of rows, each scored
  against every key (whole rows: the softmax is exact without an online rescaling), and
  only q, k, v, the output and the log-sum-exps are kept; the backward pass recomputes a
  chunk's probabilities from them (FlashAttention's recipe: one more q.k matmul) and its
  dropout mask from the counter-based bits of :func:`~.dropout.scaled_keep_mask` (the
  same draw for the same chunk, nothing stored), in float32 as the math fallback computes
  bf16 inputs.

With ``ELECTRA_SPEED=0`` (or ``ELECTRA_SPEED=-global``), on CUDA (whose fused kernels take
dropout), or under ``torch.compile``, the global layers take
``F.scaled_dot_product_attention`` with the T x T padding mask.
"""

from typing import Optional

import torch
import torch.nn.functional as F

from .dropout import draw_seed, keep_below, scaled_keep_mask
from .switch import enabled

CHUNK_BYTES = 16 * 2**20  # one chunk's float32 scores: ~128 query rows at 8k tokens/batch
FLASH_WITHOUT_DROPOUT = True  # torch's kernel where it applies (tests run the chunks too)


def use_global_kernel(q: torch.Tensor, dropout_p: float) -> bool:
    """Whether :func:`global_attention` serves q (B x heads x T x d) and this dropout."""
    return (q.device.type == "cpu" and enabled("global")
            and not torch.compiler.is_compiling()
            and (dropout_p == 0.0 or 0 < keep_below(dropout_p) < 2**15))


def global_attention(q, k, v, real: Optional[torch.Tensor], dropout_p: float) -> torch.Tensor:
    """Softmax attention of every query over the real keys of its sequence; q, k, v:
    B x heads x T x d, ``real``: bool B x T (True = token) or None -> B x heads x T x d,
    as ``F.scaled_dot_product_attention`` with the padding mask computes it at the real
    queries (a padded query sees the real keys; a sequence without any sees all its keys,
    so that no row is empty)."""
    keys = None if real is None else real | ~real.any(-1, keepdim=True)
    if dropout_p == 0.0 and FLASH_WITHOUT_DROPOUT:
        mask = None if keys is None else keys[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, mask)
    return chunked_attention(q, k, v, keys, dropout_p)


def chunked_attention(q, k, v, keys: Optional[torch.Tensor], dropout_p: float) -> torch.Tensor:
    """Softmax attention over the keys ``keys`` (bool B x T, True = may attend, no row all
    False; None: all) with dropout, in chunks of query rows whose scores take about
    ``CHUNK_BYTES``; q, k, v: B x heads x T x d -> B x heads x T x d."""
    B, heads, T, _ = q.shape
    bias = None if keys is None else torch.zeros(
        keys.shape, dtype=torch.float32, device=q.device).masked_fill_(
        ~keys, float("-inf"))[:, None, None, :]
    rows = max(1, min(T, CHUNK_BYTES // (4 * B * heads * T)))
    return _ChunkedAttention.apply(q, k, v, bias, dropout_p, rows)


def _chunk_probs(qs, kt, bias, lse, start, stop):
    """exp(scores - log-sum-exp) of query rows start:stop: their softmax."""
    scores = torch.matmul(qs[:, :, start:stop], kt)
    if bias is not None:
        scores.add_(bias)
    return scores.sub_(lse[:, :, start:stop, None]).exp_()


class _ChunkedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, dropout_p, rows):
        dtype, (B, heads, T, d) = q.dtype, q.shape
        scale = d ** -0.5
        with torch.autocast("cpu", enabled=False):
            qs = (q.float() * scale).contiguous()  # the softmax scale folded into q once
            k, v = k.float().contiguous(), v.float().contiguous()
            kt = k.transpose(-1, -2)
            out = qs.new_empty(B, heads, T, d)
            lse = qs.new_empty(B, heads, T)
            seed = draw_seed() if dropout_p else 0
            for start in range(0, T, rows):
                stop = min(start + rows, T)
                scores = torch.matmul(qs[:, :, start:stop], kt)
                if bias is not None:
                    scores.add_(bias)
                top = scores.amax(-1, keepdim=True)
                weights = scores.sub_(top).exp_()  # the softmax before its division
                total = weights.sum(-1, keepdim=True)
                lse[:, :, start:stop] = (top + total.log()).squeeze(-1)
                if dropout_p:
                    weights.mul_(_chunk_mask(weights.shape, dropout_p, seed, start, rows))
                # the division on the C x d output rather than the C x T weights
                out[:, :, start:stop] = torch.matmul(weights, v).div_(total)
        ctx.save_for_backward(qs, k, v, bias, out, lse)
        ctx.dropout_p, ctx.seed, ctx.rows, ctx.scale = dropout_p, seed, rows, scale
        return out.to(dtype)

    @staticmethod
    def backward(ctx, grad):
        qs, k, v, bias, out, lse = ctx.saved_tensors
        dtype, (B, heads, T, d) = grad.dtype, qs.shape
        p, rows = ctx.dropout_p, ctx.rows
        with torch.autocast("cpu", enabled=False):
            grad = grad.float().contiguous()
            # softmax backward's row term: sum_j P_ij dP_ij = sum_c grad_ic out_ic (dropout
            # included: P's dropped entries are the ones that did not reach the output)
            row_term = (grad * out).sum(-1, keepdim=True)
            kt, vt = k.transpose(-1, -2), v.transpose(-1, -2)
            dq = torch.empty_like(qs)
            dk, dv = torch.zeros_like(k), torch.zeros_like(v)
            flat = B * heads
            dk3, dv3 = dk.view(flat, T, d), dv.view(flat, T, d)
            for start in range(0, T, rows):
                stop = min(start + rows, T)
                probs = _chunk_probs(qs, kt, bias, lse, start, stop)
                mask = _chunk_mask(probs.shape, p, ctx.seed, start, rows) if p else None
                dropped = probs * mask if p else probs
                g = grad[:, :, start:stop]
                dv3.baddbmm_(dropped.view(flat, -1, T).transpose(1, 2),
                             g.reshape(flat, -1, d))
                # dscores = probs * (dprobs * mask - row_term) = dprobs * dropped
                # - probs * row_term: two passes
                dscores = torch.matmul(g, vt).mul_(dropped)
                del dropped
                dscores.addcmul_(probs, row_term[:, :, start:stop], value=-1)
                dq[:, :, start:stop] = torch.matmul(dscores, k)
                dk3.baddbmm_(dscores.view(flat, -1, T).transpose(1, 2),
                             qs[:, :, start:stop].reshape(flat, -1, d))
            dq.mul_(ctx.scale)
        return dq.to(dtype), dk.to(dtype), dv.to(dtype), None, None, None


def _chunk_mask(shape, p, seed, start, rows):
    """The dropout multiplier of the chunk of query rows from ``start`` (chunks of
    ``rows``): its own counters of the draw ``seed``, in forward and backward alike."""
    B, heads, _, T = shape
    per_chunk = (B * heads * rows * T + 3) // 4
    return scaled_keep_mask(shape, p, torch.float32, seed, start // rows * per_chunk)
