"""electra_adam's gradient-norm clipping against fairseq's ``utils.clip_grad_norm_``."""

import pytest
import torch
from fairseq import optim, utils

from helpers import electra_adam_cfg



def parameters(seed=0):
    """40 parameters of mixed sizes and dtypes with gradients of mixed scales; two without a
    gradient, one an ``expert`` (fairseq clips its gradient but leaves it out of the norm)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(), (1,), (3,), (256,), (64, 64), (1000, 7), (2, 3, 5)] * 5 + [(30522, 16)] * 5
    params = []
    for i, shape in enumerate(shapes):
        p = torch.nn.Parameter(torch.randn(shape, generator=g))
        if i % 13 != 5:
            p.grad = torch.randn(shape, generator=g) * 10.0 ** (i % 4 - 2)
        if i in (8, 9):
            p.data, p.grad = p.data.bfloat16(), p.grad.bfloat16()
        params.append(p)
    params[3].expert = True
    return params


def model_parallel_sum(norm):
    """An aggregate_norm_fn as model parallelism uses it: another rank's squared norm added."""
    return torch.sqrt(norm ** 2 + 9.0)


@pytest.mark.parametrize("aggregate_norm_fn", [None, model_parallel_sum])
@pytest.mark.parametrize("max_norm", [0.0, 1.0, 1e6])  # norm only; clipping; none needed
@pytest.mark.parametrize("kernel", ["fused", "foreach"])
def test_clip_grad_norm_is_fairseqs(max_norm, aggregate_norm_fn, kernel):
    """The norm is fairseq's; the clip is applied by the step that follows (the bf16 tensors
    by fairseq's loop, the others by the multi-tensor kernel), which then moves every weight
    as fairseq's clip and step do; a step without a clip of its own leaves the gradients."""
    ours, theirs = parameters(), parameters()
    optimizer = optim.build_optimizer(electra_adam_cfg(), ours)
    optimizer.optimizer.fused = kernel == "fused"
    norm = optimizer.clip_grad_norm(max_norm, aggregate_norm_fn)
    fairseq_norm = utils.clip_grad_norm_(theirs, max_norm, aggregate_norm_fn)
    before = [p.grad for p in parameters()]
    assert norm.dtype == torch.float32 and norm.shape == ()
    torch.testing.assert_close(norm, fairseq_norm, rtol=1e-6, atol=0)
    clips = 0 < max_norm < norm
    for p, original in zip(ours, before):  # untouched until the step
        assert (p.grad is None) == (original is None)
        assert original is None or torch.equal(p.grad, original)
    reference = optim.build_optimizer(electra_adam_cfg(), theirs)
    reference.optimizer.fused = kernel == "fused"
    optimizer.step()
    reference.step()
    for p, fairseq_p, fairseq_g in zip(ours, theirs, (p.grad for p in theirs)):
        if fairseq_g is not None:
            torch.testing.assert_close(p.grad, fairseq_g, rtol=1e-6, atol=0)
        torch.testing.assert_close(p, fairseq_p, rtol=1e-6, atol=1e-7)
    if clips:  # the expert's gradient scaled by the same coefficient as the others
        ratio = ours[3].grad / before[3]
        torch.testing.assert_close(ratio, torch.full_like(ratio, max_norm / norm.item()))
    for p in ours:  # a later step without a clip of its own
        if p.grad is not None:
            p.grad = torch.ones_like(p.grad)
    optimizer.step()
    assert all(p.grad is None or torch.equal(p.grad, torch.ones_like(p)) for p in ours)


def test_an_update_stopped_before_its_step_leaves_no_clip_behind():
    """An update can stop between the clip and the step (fairseq's overflow): zero_grad
    drops the coefficient the clip handed to the step."""
    params = parameters()
    optimizer = optim.build_optimizer(electra_adam_cfg(), params)
    optimizer.clip_grad_norm(1e-3)
    optimizer.zero_grad()
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in params)


def test_expert_gradients_stay_out_of_the_norm():
    params = parameters()
    optimizer = optim.build_optimizer(electra_adam_cfg(), params)
    counted = [p.grad.float() for p in params if p.grad is not None and p is not params[3]]
    expected = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in counted]))
    torch.testing.assert_close(optimizer.clip_grad_norm(0.0), expected, rtol=1e-6, atol=0)


def test_fp16_gradients_norm_in_fp32():
    """--memory-efficient-fp16 clips fp16 gradients: their norm (here ~113,500, above fp16's
    largest value, 65,504) is taken in fp32, as fairseq's; in fp16 it would be inf."""
    params = [torch.nn.Parameter(torch.zeros(4096, dtype=torch.float16)) for _ in range(3)]
    for p in params:
        p.grad = torch.full_like(p, 1024.0)
    optimizer = optim.build_optimizer(electra_adam_cfg(), params)
    norm = optimizer.clip_grad_norm(0.0)
    assert norm.dtype == torch.float32
    torch.testing.assert_close(norm, utils.clip_grad_norm_(params, 0.0), rtol=1e-6, atol=0)
    assert norm.item() == pytest.approx(1024.0 * (3 * 4096) ** 0.5, rel=1e-6)


def test_zero_and_one_gradient_are_fairseqs():
    for with_grad in (0, 1):
        params = [torch.nn.Parameter(torch.ones(3)) for _ in range(4)]
        for p in params[:with_grad]:
            p.grad = torch.full((3,), 2.0)
        optimizer = optim.build_optimizer(electra_adam_cfg(), params)
        norm = optimizer.clip_grad_norm(1.0)
        assert norm.item() == pytest.approx(2.0 * 3 ** 0.5 if with_grad else 0.0)
        if with_grad:
            torch.testing.assert_close(params[0].grad.norm(), torch.tensor(1.0))


def norm_ops(fn):
    """Names of the norm ops ``fn`` calls (not those they call), in order."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if "norm" in e.name and e.cpu_parent is None]


def test_the_norms_are_one_op_and_the_switch_gives_fairseqs_loop(monkeypatch):
    params = parameters()
    optimizer = optim.build_optimizer(electra_adam_cfg(), params)
    counted = sum(p.grad is not None and not hasattr(p, "expert") for p in params)
    fast = norm_ops(lambda: optimizer.clip_grad_norm(1.0))
    # one per dtype (fp32, bf16), then the total
    assert fast == ["aten::_foreach_norm"] * 2 + ["aten::linalg_vector_norm"], fast
    monkeypatch.setenv("ELECTRA_SPEED", "0")
    plain = norm_ops(lambda: optimizer.clip_grad_norm(1.0))
    assert len(plain) == counted + 1 and "aten::_foreach_norm" not in plain, plain
