"""CapturableAdam (speed/capturable_adam.py) against fairseq's own Adam over several
updates: an lr that changes every update, fairseq's clip and an overflowed update that
fairseq skips; the update compiled whole and never recompiled; checkpoints moved both ways;
on a GPU, the update captured once as a CUDA graph and replayed."""

import copy

import pytest
import torch
from fairseq.optim.adam import Adam

from electra_plugin.profiling.host_work import HostWork
from electra_plugin.speed.capturable_adam import CapturableAdam

# two groups as electra_adam makes them: weights decayed at the scheduled lr, biases and
# LayerNorm exempt at a layer-decayed lr
SHAPES = [(64, 33), (40, 16), (2, 5, 7), (33,), (16,)]
MAX_NORM = 2.0
OVERFLOW = 5  # the update whose gradients hold an inf


def make_params(device="cpu"):
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=generator).to(device))
            for s in SHAPES]


def groups_of(params):
    return [{"params": params[:3], "lr_scale": 1.0, "weight_decay": 0.1},
            {"params": params[3:], "lr_scale": 0.8, "weight_decay": 0.0}]


def lr_at(update):
    """fairseq's polynomial_decay (power 1): 3 updates of warm-up to 1e-2, then linear
    decay to 0 at update 12."""
    return 1e-2 * update / 3 if update <= 3 else 1e-2 * (12 - update) / 9


def gradients(update, device="cpu"):
    """Growing with the update, so that fairseq's clip scales the later ones."""
    generator = torch.Generator().manual_seed(update)
    grads = [0.01 * update * torch.randn(s, generator=generator) for s in SHAPES]
    if update == OVERFLOW:
        grads[1][3, 4] = float("inf")
    return [g.to(device) for g in grads]


def set_lr(optimizer, update):
    """``ElectraAdam.set_lr``: the scheduled lr times each group's scale."""
    for group in optimizer.param_groups:
        group["lr"] = lr_at(update) * group["lr_scale"]
    if isinstance(optimizer, CapturableAdam):
        optimizer.lr_to_device()


def norm_and_clip(grads):
    """fairseq's clip_grad_norm_: the total norm and the coefficient it scales by."""
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    return norm, (MAX_NORM / (norm + 1e-6)).clamp(max=1)


def fairseq_update(optimizer, params, update):
    """fairseq's trainer: an overflowed update is never stepped; the others are clipped in
    place, then stepped."""
    grads = gradients(update, params[0].device)
    norm, clip = norm_and_clip(grads)
    set_lr(optimizer, update)
    if not torch.isfinite(norm):
        return
    torch._foreach_mul_(grads, clip)
    for p, g in zip(params, grads):
        p.grad = g
    optimizer.step()


def device_inputs(optimizer, params, update):
    """What the graphed step would hand the capturable update: the gradients in the
    ``.grad`` tensors, the overflow flag and clip coefficient on the device."""
    grads = gradients(update, params[0].device)
    norm, clip = norm_and_clip(grads)
    for p, g in zip(params, grads):
        if p.grad is None:
            p.grad = g
        else:
            p.grad.copy_(g)
    optimizer.found_inf.copy_(~torch.isfinite(norm))
    optimizer.clip_coef.copy_(clip)
    set_lr(optimizer, update)


def snapshot(optimizer, params):
    return [t.clone() for p in params for t in
            (p, optimizer.state[p]["exp_avg"], optimizer.state[p]["exp_avg_sq"])]


def addresses(optimizer, params):
    return [optimizer.state[p][key].data_ptr() for p in params
            for key in ("step", "exp_avg", "exp_avg_sq")] + [optimizer.lr.data_ptr()]


def assert_like_fairseq(ours, our_params, theirs, their_params):
    """Weights within fp32 rounding of the update, moments 1e-6 relative, steps equal."""
    for p, q in zip(our_params, their_params):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(ours.state[p][key], theirs.state[q][key], rtol=1e-6,
                                       atol=1e-12)
        assert int(ours.state[p]["step"]) == theirs.state[q]["step"]


def max_difference(params, others):
    return max((p - q).abs().max().item() for p, q in zip(params, others))


def test_updates_equal_fairseqs_adam_through_a_schedule_a_clip_and_an_overflow():
    theirs, ours = make_params(), make_params()
    reference = Adam(groups_of(theirs), lr=1e-3, eps=1e-6)
    optimizer = CapturableAdam(groups_of(ours), lr=1e-3, eps=1e-6)
    for update in range(1, 11):
        fairseq_update(reference, theirs, update)
        device_inputs(optimizer, ours, update)
        before = snapshot(optimizer, ours)
        with HostWork() as work:
            optimizer.step()
        assert work.syncs == 0
        if update == OVERFLOW:  # nothing moved, the step counts included
            assert all(torch.equal(a, b) for a, b in zip(before, snapshot(optimizer, ours)))
            assert optimizer.steps.tolist() == [OVERFLOW - 1] * 2
            assert not any(p.grad.isnan().any() for p in ours)
        assert_like_fairseq(optimizer, ours, reference, theirs)
    assert reference.state[theirs[0]]["step"] == 9
    assert max_difference(ours, theirs) < 1e-6
    assert max_difference(ours, make_params()) > 1e-2  # (the weights did move)


def test_an_overflow_at_the_first_update_leaves_fairseqs_fresh_state():
    params = make_params()
    optimizer = CapturableAdam(groups_of(params), lr=1e-3)
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    optimizer.found_inf.fill_(1.0)
    optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(params, make_params()))
    assert optimizer.state_dict()["state"] == {}  # fairseq's Adam before its first step
    theirs = make_params()
    reference = Adam(groups_of(theirs), lr=1e-3)
    optimizer.found_inf.fill_(0.0)
    for p, q, g in zip(params, theirs, gradients(1)):
        p.grad, q.grad = g.clone(), g
    reference.step()
    optimizer.step()
    assert_like_fairseq(optimizer, params, reference, theirs)


@pytest.mark.slow  # (dynamo's compile: ~3 s on 2 cores)
def test_the_update_compiles_whole_and_a_new_lr_or_overflow_does_not_recompile():
    """fullgraph: nothing in the update reads the host; error_on_recompile: no number that
    changes between updates reaches dynamo's guards. The compiled update is the eager one
    bit for bit."""
    eager_params, compiled_params = make_params(), make_params()
    eager = CapturableAdam(groups_of(eager_params), lr=1e-3)
    compiled = CapturableAdam(groups_of(compiled_params), lr=1e-3)

    def update():
        compiled.step()

    step = torch.compile(update, fullgraph=True, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for number in range(1, 7):
            device_inputs(eager, eager_params, number)
            device_inputs(compiled, compiled_params, number)
            eager.step()
            with HostWork() as work:
                step()
            assert work.syncs == 0 and work.kernels == work.graph_kernels > 0
            assert all(torch.equal(a, b) for a, b in
                       zip(snapshot(eager, eager_params), snapshot(compiled, compiled_params)))
    assert compiled.steps.tolist() == [5.0, 5.0]


def test_checkpoints_move_between_fairseqs_adam_and_this_one():
    theirs = make_params()
    reference = Adam(groups_of(theirs), lr=1e-3)
    for update in range(1, 4):
        fairseq_update(reference, theirs, update)

    ours = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
    optimizer = CapturableAdam(groups_of(ours), lr=1e-3)
    held = addresses(optimizer, ours)
    optimizer.load_state_dict(copy.deepcopy(reference.state_dict()))
    assert addresses(optimizer, ours) == held  # loaded into what a captured update reads
    for update in range(4, 7):  # the overflow included
        fairseq_update(reference, theirs, update)
        device_inputs(optimizer, ours, update)
        optimizer.step()
    assert_like_fairseq(optimizer, ours, reference, theirs)

    saved = optimizer.state_dict()
    assert saved["param_groups"] == reference.state_dict()["param_groups"]
    assert {type(s["step"]) for s in saved["state"].values()} == {int}
    back = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    restored = Adam(groups_of(back), lr=1e-3)
    restored.load_state_dict(copy.deepcopy(saved))
    for update in range(7, 9):
        fairseq_update(restored, back, update)
        device_inputs(optimizer, ours, update)
        optimizer.step()
    assert_like_fairseq(optimizer, ours, restored, back)

    saved["state"][4]["step"] -= 1  # one LayerNorm weight behind the rest of its group
    with pytest.raises(ValueError, match="steps a group's parameters together"):
        optimizer.load_state_dict(saved)
    ours[0].grad = None
    with pytest.raises(ValueError, match="each needs a gradient"):
        optimizer.step()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_update_captured_as_a_cuda_graph_replays_the_eager_one():
    """Captured once after a warm-up (an overflowed step: it changes nothing), replayed
    through the schedule and an overflow: the eager update's numbers bit for bit, and
    fairseq's Adam's on the same GPU within rounding."""
    eager_params, graph_params, theirs = (make_params("cuda") for _ in range(3))
    eager = CapturableAdam(groups_of(eager_params), lr=1e-3)
    captured = CapturableAdam(groups_of(graph_params), lr=1e-3)
    reference = Adam(groups_of(theirs), lr=1e-3)
    for p in graph_params:
        p.grad = torch.zeros_like(p)
    captured.found_inf.fill_(1.0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        captured.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured.step()
    assert all(torch.equal(p, q) for p, q in zip(graph_params, make_params("cuda")))

    for update in range(1, 11):
        fairseq_update(reference, theirs, update)
        device_inputs(eager, eager_params, update)
        eager.step()
        device_inputs(captured, graph_params, update)
        graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in
               zip(snapshot(eager, eager_params), snapshot(captured, graph_params)))
    assert captured.steps.tolist() == [9.0, 9.0]
    assert_like_fairseq(captured, graph_params, reference, theirs)
