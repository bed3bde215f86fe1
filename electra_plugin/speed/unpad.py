"""Unpadded batches: the position-wise work of a layer (projections, feed-forward, norms) on
the batch's real tokens only, N x C rows instead of B x T x C.

Part of :mod:`electra_plugin.speed`; with ``ELECTRA_SPEED=0`` (or ``-unpad``, or a batch
without padding) every tensor stays on the padded B x T grid; in a ``torch.compile`` trace
the rows are every position, the real tokens first (:class:`Layout`'s ``static``).
Attention needs each sequence's keys: it re-pads q, k and v and runs
``F.scaled_dot_product_attention`` with the padding mask as its boolean block mask (a
sliding-window layer: :mod:`.window`'s blocks, or the window in that mask where the blocks
would not save work; a global layer on CPU: :mod:`.global_attention`, without the T x T
mask or scores kept for the backward pass), or, on CUDA in half precision with the
``flash_attn`` package installed (an optional extra), flash attention's variable-length
kernel straight on the rows.
"""

from functools import cached_property
from typing import Optional

import torch
import torch.nn.functional as F

from .global_attention import global_attention, use_global_kernel
from .switch import enabled
from .window import use_window_kernel, window_attention, window_mask

try:  # optional: the variable-length CUDA kernel
    from flash_attn import flash_attn_varlen_func
except ImportError:  # pragma: no cover - the CPU and CI case
    flash_attn_varlen_func = None


class Layout:
    """Where a batch's tokens are: the B x T grid (``rows`` None) or rows of the flat B*T
    positions (``rows``: their indices), and their positions within the sequence.
    ``padding_mask``: None for a batch without padding (the caller knows it without a
    host-device sync: :class:`~electra_plugin.models.core.contract.BatchLayout`).

    The rows are the real tokens' (``nonzero``: N = the batch's token count, which the host
    must read from the device), or with ``static`` (a graph's trace: ``--graphed-step``
    takes the step whole, and a graph holds no shape that depends on the data) every
    position, the real tokens first in the same order, then the padding: N = B*T, a stable
    sort of the mask. That costs the padded grid's position-wise work (B*T minus the token
    count rows wasted) on top of the unpadded layout's gathers; the padded rows never leave
    the layout (:meth:`unpack` and the varlen kernel zero them), so the real rows are the
    unpadded layout's."""

    def __init__(self, padding_mask: Optional[torch.Tensor], batch: int, length: int,
                 device, static: bool = False):
        self.batch, self.length = batch, length
        self.padding_mask = padding_mask
        self.rows = self.padded = None  # padded (static rows only): True at the padding
        if self.padding_mask is not None and enabled("unpad"):
            flat = self.padding_mask.flatten()
            if static:
                self.rows = torch.argsort(flat, stable=True)
                self.padded = flat[self.rows]
            else:
                self.rows = (~flat).nonzero().squeeze(1)
            self.positions = self.rows % length
        else:
            self.positions = torch.arange(length, device=device)
        self.masks = {}  # every layer of a kind asks for the same mask: once per batch

    @cached_property
    def sequences(self):
        """(cu_seqlens, longest length) for the variable-length kernel, once per batch; with
        static rows the longest is the padded length, a bound the host knows without a
        sync."""
        lengths = (~self.padding_mask).sum(1, dtype=torch.int32)
        longest = self.length if self.padded is not None else int(lengths.max())
        return F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0)), longest

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """B x T x C -> this layout (N x C unpadded)."""
        return x if self.rows is None else x.flatten(0, 1)[self.rows]

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """This layout -> B x T x C, zeros at the padded positions."""
        if self.rows is None:
            return x
        out = x.new_zeros(self.batch * self.length, *x.shape[1:])
        out[self.rows] = self.real(x)
        return out.view(self.batch, self.length, *x.shape[1:])

    def real(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of this layout with the static layout's padded rows zeroed, forward and
        backward (masked_fill drops their gradient whatever it holds)."""
        if self.padded is None:
            return x
        return x.masked_fill(self.padded.view(-1, *[1] * (x.dim() - 1)), 0)

    def mask(self, window: Optional[int], blocks: bool) -> Optional[torch.Tensor]:
        """:meth:`_mask`, built at its first call (a dictionary: dynamo traces no
        ``lru_cache`` made in the graph)."""
        if (window, blocks) not in self.masks:
            self.masks[window, blocks] = self._mask(window, blocks)
        return self.masks[window, blocks]

    def _mask(self, window: Optional[int], blocks: bool) -> Optional[torch.Tensor]:
        """bool B x 1 x T x T (or 1 x 1 x T x T) "may attend": real keys within ``window``
        positions of the query (None: any distance), or None when everything may. A padded
        query attends to itself too, so that no row of scores is empty (NaN). ``blocks``:
        the same for :func:`.window.window_attention`'s blocks."""
        if blocks:
            real = None if self.padding_mask is None else ~self.padding_mask
            return window_mask(real, self.length, window, self.positions.device)
        mask = None
        ids = torch.arange(self.length, device=self.positions.device)
        if window is not None and window < self.length - 1:
            mask = ((ids[:, None] - ids[None, :]).abs() <= window)[None, None]
        if self.padding_mask is not None:
            keys = (~self.padding_mask)[:, None, None, :]
            mask = keys if mask is None else mask & keys
            mask = mask | (ids[:, None] == ids[None, :])
        return mask

    def attention(self, q, k, v, window: Optional[int], dropout_p: float) -> torch.Tensor:
        """Softmax attention of rows q, k, v (this layout x heads x d) -> this layout x
        heads x d."""
        if self.rows is not None and flash_attn_varlen_func is not None and q.is_cuda and \
                q.dtype in (torch.float16, torch.bfloat16):
            side = -1 if window is None else window
            cu_seqlens, longest = self.sequences
            # the kernel reads and writes the first cu_seqlens[-1] rows: static padded rows
            # come out (and their gradients back) uninitialized
            q, k, v = (self.real(t) for t in (q, k, v))
            return self.real(flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest,
                                                    longest, dropout_p,
                                                    window_size=(side, side)))
        q, k, v = (self.unpack(t).transpose(1, 2) for t in (q, k, v))  # B x heads x T x d
        if use_window_kernel(self.length, window):
            out = window_attention(q, k, v, self.mask(window, True), window, dropout_p)
        elif window is None and use_global_kernel(q, dropout_p):
            real = None if self.padding_mask is None else ~self.padding_mask
            out = global_attention(q, k, v, real, dropout_p)
        else:
            out = F.scaled_dot_product_attention(q, k, v, self.mask(window, False), dropout_p)
        return self.pack(out.transpose(1, 2))
