"""The sliding-window kernel (electra_plugin.speed.window): the dense masked attention it
replaces, to 1e-5 forward and backward, at a cost that grows linearly with the length."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from electra_plugin.speed.window import (keys_per_query, use_window_kernel, window_attention,
                                         window_mask)
from helpers import small_modern_encoder


def dense_window_attention(q, k, v, real, window):
    """The modern body's attention before the kernel: the whole T x T scores, masked."""
    ids = torch.arange(q.size(2))
    mask = ((ids[:, None] - ids[None, :]).abs() <= window) & real[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, mask | (ids[:, None] == ids[None, :]))


@pytest.mark.parametrize("length,window,cuts", [
    (40, 8, (40, 31, 12)),       # blocks of 8, last block full
    (37, 5, (37, 20, 1)),        # a ragged last block, a one-token row
    (300, 0, (300, 299, 150)),   # each token attends to itself only
    (256, 64, (256, 256, 256)),  # no padding
    (20, 64, (20, 15, 3)),       # a window wider than the sequence
])
def test_window_kernel_equals_the_dense_masked_attention(length, window, cuts):
    gen = torch.Generator().manual_seed(length + window)
    q, k, v = (torch.randn(3, 2, length, 16, generator=gen).requires_grad_()
               for _ in range(3))
    real = torch.arange(length)[None, :] < torch.tensor(cuts)[:, None]
    weights = torch.randn(3, 2, length, 16, generator=gen) * real[:, None, :, None]
    outputs, grads = [], []
    for run in (lambda: dense_window_attention(q, k, v, real, window),
                lambda: window_attention(q, k, v, window_mask(real, length, window, "cpu"),
                                         window, 0.0)):
        out = run()
        outputs.append(out * real[:, None, :, None])
        grads.append(torch.autograd.grad((out * weights).sum(), (q, k, v)))
    assert (outputs[0] - outputs[1]).abs().max() <= 1e-5
    for dense, blocked in zip(*grads):
        assert (dense - blocked).abs().max() <= 1e-5


def test_window_kernel_work_grows_linearly_with_the_length():
    """FLOPs of forward and backward at 1,024 and 4,096 tokens: 4x the length, 4x the work
    (the dense masked attention does 16x)."""
    def flops(length):
        q, k, v = (torch.randn(1, 2, length, 16, requires_grad=True) for _ in range(3))
        with FlopCounterMode(display=False) as counter:
            window_attention(q, k, v, window_mask(None, length, 64, "cpu"), 64,
                             0.0).sum().backward()
        return counter.get_total_flops()
    assert flops(4096) == 4 * flops(1024)
    assert keys_per_query(4096, 64) == keys_per_query(1024, 64) == 192
    assert keys_per_query(300, 64) == 300  # blocks over half the sequence: all keys


@pytest.mark.parametrize("padded", [True, False])
def test_modern_layers_train_the_same_through_the_kernel(padded, monkeypatch):
    """A 4-layer modern encoder (16-token window, one global layer) over 160 tokens, rows
    unpadded or not: outputs and every parameter's gradient as with the dense masked path
    (ELECTRA_SPEED=-window)."""
    encoder = small_modern_encoder(window=16)
    tokens = torch.randint(3, 50, (2, 160), generator=torch.Generator().manual_seed(0))
    if padded:
        tokens[1, 100:] = 1
    real = tokens.ne(1)[..., None]
    results = []
    for speed in ("1", "-window"):
        monkeypatch.setenv("ELECTRA_SPEED", speed)
        assert use_window_kernel(160, 8) is (speed == "1")
        encoder.zero_grad()
        out = encoder(tokens)[0] * real
        (out * torch.linspace(-1, 1, 32)).sum().backward()
        results.append([out] + [p.grad.clone() for p in encoder.parameters()])
    assert (results[0][0] - results[1][0]).abs().max() <= 1e-5
    for fast, dense in zip(results[0][1:], results[1][1:]):  # sums over 320 tokens
        assert (fast - dense).abs().max() <= 1e-5 * dense.abs().max()
