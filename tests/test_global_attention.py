"""The modern body's global layers on CPU (electra_plugin.speed.global_attention): the masked
attention they replace, to 1e-5 forward and backward, without a T x T tensor kept for the
backward pass."""

import pytest
import torch
import torch.nn.functional as F

from electra_plugin.speed import global_attention as kernel
from electra_plugin.speed import unpad
from electra_plugin.speed.dropout import draw_seed
from electra_plugin.speed.global_attention import (_chunk_mask, chunked_attention,
                                                   global_attention, use_global_kernel)
from helpers import small_modern_encoder


def masked_attention(q, k, v, real, dropout_mask=None):
    """The global layers before the kernel (Layout's T x T mask: real keys, and each query
    itself); with ``dropout_mask``, the same math with that multiplier on the softmax."""
    ids = torch.arange(q.size(2))
    mask = real[:, None, None, :] | (ids[:, None] == ids[None, :])
    if dropout_mask is None:
        return F.scaled_dot_product_attention(q, k, v, mask)
    scores = (q @ k.transpose(-1, -2)) * q.size(-1) ** -0.5
    return (scores.masked_fill(~mask, float("-inf")).softmax(-1) * dropout_mask) @ v


def outputs_and_grads(run, q, k, v, real, weights):
    """Output at the real queries and the gradients of q, k, v (padded queries' outputs are
    dropped by the unpadded layout, so they weigh nothing)."""
    out = run()
    return [out * real[:, None, :, None], *torch.autograd.grad((out * weights).sum(), (q, k, v))]


def inputs(length, cuts, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(len(cuts), 2, length, d, generator=gen).requires_grad_()
               for _ in range(3))
    real = torch.arange(length)[None, :] < torch.tensor(cuts)[:, None]
    weights = torch.randn(len(cuts), 2, length, d, generator=gen) * real[:, None, :, None]
    return q, k, v, real, weights


def assert_close(expected, got, tolerance=1e-5):
    for a, b in zip(expected, got):
        assert (a - b).abs().max() <= tolerance


@pytest.mark.parametrize("length,cuts,rows", [
    (37, (37, 20, 1), 5),     # chunks of 5 rows, a ragged last chunk, a one-token sequence
    (64, (64, 64), 64),       # no padding, one chunk
    (50, (50, 31, 7), 1),     # one row per chunk
])
def test_chunks_equal_the_masked_attention(length, cuts, rows, monkeypatch):
    q, k, v, real, weights = inputs(length, cuts)
    monkeypatch.setattr(kernel, "CHUNK_BYTES", 4 * len(cuts) * 2 * length * rows)
    expected = outputs_and_grads(lambda: masked_attention(q, k, v, real), q, k, v, real,
                                 weights)
    for keys in [real] + ([None] if min(cuts) == length else []):
        got = outputs_and_grads(lambda: chunked_attention(q, k, v, keys, 0.0), q, k, v,
                                real, weights)
        assert_close(expected, got)
    flash = outputs_and_grads(lambda: global_attention(q, k, v, real, 0.0), q, k, v, real,
                              weights)
    assert_close(expected, flash)


def test_a_sequence_without_tokens_gives_no_nan():
    q, k, v, real, weights = inputs(12, (12, 0))
    for p in (0.0, 0.1):
        out = global_attention(q, k, v, real, p)
        assert torch.isfinite(out).all()
        grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
        assert all(torch.isfinite(g).all() for g in grads)


def test_dropout_is_the_math_with_a_mask_drawn_again_in_the_backward_pass(monkeypatch):
    """With dropout 0.25, chunks of 7 rows: the output and gradients of the dense math with
    the kernel's own mask (its chunks' counters of one seed), which keeps ~75% of the
    probabilities at 1/0.75."""
    length, rows, p = 40, 7, 0.25
    q, k, v, real, weights = inputs(length, (40, 23))
    monkeypatch.setattr(kernel, "CHUNK_BYTES", 4 * 2 * 2 * length * rows)
    torch.manual_seed(3)
    got = outputs_and_grads(lambda: chunked_attention(q, k, v, real, p), q, k, v, real,
                            weights)
    torch.manual_seed(3)
    seed = draw_seed()
    mask = torch.cat([_chunk_mask((2, 2, min(start + rows, length) - start, length), p, seed,
                                  start, rows) for start in range(0, length, rows)], dim=2)
    expected = outputs_and_grads(lambda: masked_attention(q, k, v, real, mask), q, k, v, real,
                                 weights)
    assert_close(expected, got)
    assert mask.unique().tolist() == pytest.approx([0.0, 2**15 / round(0.75 * 2**15)])
    assert (mask > 0).float().mean().item() == pytest.approx(0.75, abs=0.02)
    torch.manual_seed(4)  # another seed, other draws
    other = chunked_attention(q, k, v, real, p) * real[:, None, :, None]
    assert (other - got[0]).abs().max() > 0.1


def test_bf16_inputs_are_computed_in_float32_as_the_math_fallback_does():
    q, k, v, real, weights = inputs(24, (24, 11))
    low = [t.detach().bfloat16().requires_grad_() for t in (q, k, v)]
    expected = masked_attention(*(t.float() for t in low), real)
    out = chunked_attention(*low, real, 0.0)
    assert out.dtype == torch.bfloat16
    assert ((out.float() - expected) * real[:, None, :, None]).abs().max() <= 1e-2
    out.float().mul(weights).sum().backward()
    assert all(t.grad.dtype == torch.bfloat16 and torch.isfinite(t.grad).all() for t in low)


def test_no_t_by_t_tensor_is_kept_for_the_backward_pass():
    """What autograd keeps of a 256-token global attention with dropout: every tensor is
    O(T x d) (the math fallback that the dropout took keeps three T x T per head)."""
    q, k, v, real, _ = inputs(256, (256, 100))

    def largest_kept(run):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t,
                                                      lambda t: t):
            run()
        return max(sizes)

    assert largest_kept(lambda: global_attention(q, k, v, real, 0.1)) == 2 * 2 * 256 * 16
    assert largest_kept(lambda: global_attention(q, k, v, real, 0.0)) == 2 * 2 * 256 * 16
    assert largest_kept(lambda: F.scaled_dot_product_attention(q, k, v, None, 0.1)) == \
        2 * 2 * 256 * 256


def test_only_cpu_with_the_switch_on_and_an_expressible_dropout(monkeypatch):
    q = torch.zeros(1, 1, 4, 8)
    assert use_global_kernel(q, 0.1) and use_global_kernel(q, 0.0)
    assert not use_global_kernel(q, 1e-6)  # 15 bits cannot express it: SDPA's math
    monkeypatch.setenv("ELECTRA_SPEED", "-global")
    assert not use_global_kernel(q, 0.1)
    monkeypatch.setenv("ELECTRA_SPEED", "0")
    assert not use_global_kernel(q, 0.1)


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("padded", [True, False])
def test_modern_encoder_trains_the_same_through_the_kernel(padded, flash, monkeypatch):
    """A 4-layer modern encoder (two global layers) over 48 tokens, a padded batch or not:
    outputs and every parameter's gradient as with the masked SDPA (ELECTRA_SPEED=-global),
    through torch's flash kernel or through the chunks (5 query rows each)."""
    encoder = small_modern_encoder(window=8)
    tokens = torch.randint(3, 50, (3, 48), generator=torch.Generator().manual_seed(0))
    if padded:
        tokens[1, 30:] = 1
        tokens[2, 2:] = 1
    real = tokens.ne(1)[..., None]
    monkeypatch.setattr(kernel, "FLASH_WITHOUT_DROPOUT", flash)
    monkeypatch.setattr(kernel, "CHUNK_BYTES", 4 * 3 * 2 * 48 * 5)
    calls = {"global": 0, "chunked": 0}

    def counted(name, function):
        def run(*args):
            calls[name] += 1
            return function(*args)
        return run
    monkeypatch.setattr(unpad, "global_attention", counted("global", unpad.global_attention))
    monkeypatch.setattr(kernel, "chunked_attention",
                        counted("chunked", kernel.chunked_attention))
    results = []
    for speed in ("1", "-global"):
        monkeypatch.setenv("ELECTRA_SPEED", speed)
        encoder.zero_grad()
        out = encoder(tokens)[0] * real
        (out * torch.linspace(-1, 1, 32)).sum().backward()
        results.append([out] + [p.grad.clone() for p in encoder.parameters()])
    # both global layers, only with the switch on
    assert calls == {"global": 2, "chunked": 0 if flash else 2}
    assert (results[0][0] - results[1][0]).abs().max() <= 1e-5
    for fast, dense in zip(results[0][1:], results[1][1:]):  # sums over up to 144 tokens
        assert (fast - dense).abs().max() <= 1e-5 * max(dense.abs().max(), 1)
