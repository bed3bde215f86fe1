"""fairseq's gradient-norm clipping with the norms taken in one multi-tensor op; part of
:mod:`electra_plugin.speed` (``ELECTRA_SPEED=0``: fairseq's ``utils.clip_grad_norm_``).

Without apex, fairseq takes the gradient norm tensor by tensor in Python (``torch.norm`` of
each gradient, moved to one device, stacked): ~400 small ops for ELECTRA-Small, each a kernel
launch on a GPU. ``torch._foreach_norm`` takes all of a device's and dtype's norms in one
call. The rest is fairseq's: the clip coefficient, its single ``_foreach_mul_``, what is
returned. (fairseq's ``multiply_grads`` is already one ``_foreach_mul_`` per device and dtype.)
Given the :class:`MultiTensorAdam` that steps next, the coefficient goes to it instead of a
``_foreach_mul_``: its kernel scales each gradient as it reads it.
"""

from collections import defaultdict

import torch
from fairseq import utils

from .adam import MultiTensorAdam
from .switch import enabled


def clip_grad_norm_(params, max_norm, aggregate_norm_fn=None, optimizer=None) -> torch.Tensor:
    """fairseq's ``utils.clip_grad_norm_``: the fp32 2-norm of the gradients of ``params``
    (those with one, ``expert`` parameters left out, after ``aggregate_norm_fn``), returned as
    it was before clipping; with ``max_norm > 0`` every gradient, experts' included, is scaled
    by ``min(1, max_norm / (norm + 1e-6))``: by ``optimizer``'s next step where that is a
    :class:`MultiTensorAdam` (the gradients are then clipped once it has read them).

    The norm is fairseq's up to fp32 rounding (bit for bit on CPU when the gradients share
    one dtype). It lands on the first gradient's device, where fairseq puts it on the
    current CUDA device whenever there is one (CPU training on a GPU machine).
    """
    params = list(params)
    with_grad = [p for p in params if p is not None and p.grad is not None]
    grads = [p.grad for p in with_grad if not hasattr(p, "expert")]  # norms: no detach
    if not enabled("clip") or len(grads) < 2:  # (0 or 1 gradient: fairseq's takes no loop)
        return utils.clip_grad_norm_(params, max_norm, aggregate_norm_fn)
    total_norm = grad_norm(grads)
    if aggregate_norm_fn is not None:
        total_norm = aggregate_norm_fn(total_norm)
    if max_norm > 0 and isinstance(optimizer, MultiTensorAdam):
        optimizer.clip_coef = clip_coefficient(total_norm, max_norm)
    elif max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(with_grad, max_norm, total_norm)
    return total_norm


def clip_coefficient(norm, max_norm):
    """What the gradients are scaled by: ``min(1, max_norm / (norm + 1e-6))``, on the
    norm's device (fairseq's and torch's rule)."""
    return (max_norm / (norm + 1e-6)).clamp(max=1.0)


def grad_norm(grads):
    """fp32 2-norm of all ``grads``: one ``_foreach_norm`` per device and dtype (in fp32, as
    fairseq's ``torch.norm(g, dtype=torch.float32)``: fp16 gradients' norms would overflow)."""
    by_device_dtype = defaultdict(list)
    for g in grads:
        by_device_dtype[g.device, g.dtype].append(g)
    device = grads[0].device
    norms = [torch.stack(torch._foreach_norm(group, 2, dtype=torch.float32)).to(device)
             for group in by_device_dtype.values()]
    return torch.linalg.vector_norm(torch.cat(norms))
