"""The whole update compiled as one function (speed/whole_update.py) against fairseq's eager
update (the plugin's ElectraAdam without speed/'s parts: fairseq's multiply_grads, clip and
Adam) over a warm-up and decay of the lr, an overflowed update and two micro-batches per
update; on a CPU, and on a GPU (``pytest -m gpu``) replayed as one CUDA graph."""

import functools
import logging
import shutil

import pytest
import torch
from fairseq.trainer import Trainer
from omegaconf import OmegaConf

from electra_plugin.criterions.electra import ElectraCriterion
from electra_plugin.data.masking import prediction_slots
from electra_plugin.optim.layer_decay import ElectraAdam
from electra_plugin.profiling.host_work import HostWork
from electra_plugin.speed.capturable_adam import CapturableAdam
from electra_plugin.speed import compile as compile_module
from electra_plugin.speed.compile import GraphedStep
from electra_plugin.speed.switch import VARIABLE
from electra_plugin.speed.whole_update import WholeUpdate
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import checkpoint, electra_adam_cfg, masked_batch, tiny_model, train_cmd, \
    train_in_process

UPDATES = 10
OVERFLOW = 5  # this update's first micro-batch has an infinite weight: its norm is not finite
READ = 7  # after this update the host reads the skips (until then it counts the skipped one)
CLIP = 1.0
SLOTS = 10  # prediction slots per row: one shape for every batch


def lr_at(count):
    """fairseq's polynomial_decay (power 1) at fairseq's update count: 3 updates of warm-up
    to 1e-2, then linear decay to 0 at 12."""
    return 1e-2 * (count + 1) / 3 if count < 3 else 1e-2 * (12 - count) / 9


def batches(task, update, device="cpu"):
    """The update's two micro-batches (src_tokens, target, masked_positions, masked_weights)."""
    made = []
    for seed in (2 * update, 2 * update + 1):
        src, target, _, picked = masked_batch(task, rows=3, length=20, seed=seed)
        positions, weights = prediction_slots(picked, SLOTS)
        if update == OVERFLOW and not made:
            weights[0] = float("inf")
        made.append(tuple(t.to(device) for t in (src, target, positions, weights)))
    return made


def built(device="cpu"):
    model, task = tiny_model(dropout=0.0, attention_dropout=0.0, num_layers=1)
    model.to(device).train()
    return model, task, ElectraCriterion(task, disc_weight=50.0)


def eager_update(model, criterion, optimizer, micro_batches):
    """fairseq's trainer: each micro-batch's loss backward, multiply_grads by 1 / sample_size,
    the clip, the step unless the norm is not finite -> (each micro-batch's loss, the norm,
    whether it stepped)."""
    optimizer.zero_grad()
    losses = []
    for src, target, positions, weights in micro_batches:
        sample = {"net_input": {"src_tokens": src, "masked_positions": positions,
                                "masked_weights": weights, "has_padding": True},
                  "target": target, "ntokens": src.numel(), "nsentences": len(src),
                  "nmasked": len(positions)}  # (the FLOPs count's, read on the host)
        loss, _, _ = criterion(model, sample)
        loss.backward()
        losses.append(loss.detach())
    optimizer.multiply_grads(1.0 / len(micro_batches))
    norm = optimizer.clip_grad_norm(CLIP)
    if not torch.isfinite(norm):
        return losses, norm, False
    optimizer.step()
    return losses, norm, True


# how far the whole update may sit from fairseq's eager update: the weights (absolute), the
# moments (of the model's largest) and the norm and losses (relative). On a CPU: the graph's
# backward (torch.func's) sums the same products in another order than autograd's, so
# gradients differ in their last bits, and Adam's m / sqrt(v) passes that on at the lr's
# scale (1e-6: a few fp32 ulps at the weights' size, 1e-4 of one update's move at lr 1e-2).
# On a GPU inductor's fused kernels also sum in their own order: ten times that, a guess
# until the first GPU run measures it (an update applied twice or lost moves by the lr).
TOLERANCE = {"cpu": dict(weights=1e-6, moments=1e-5, rtol=1e-5),
             "cuda": dict(weights=1e-5, moments=1e-4, rtol=1e-4)}


def check_against_eager(monkeypatch, device, backend):
    """The whole update on ``device`` against fairseq's eager update there, update by
    update (see the tests)."""
    tolerance = TOLERANCE[device]
    monkeypatch.setattr(compile_module, "CHECK_EVERY", UPDATES + 1)
    eager_model, task, eager_criterion = built(device)
    model, _, criterion = built(device)
    cfg = OmegaConf.merge(electra_adam_cfg(weight_decay=0.01), {"adam_eps": 1e-6})  # ELECTRA's
    eager = ElectraAdam(cfg, list(eager_model.parameters()))
    assert type(eager.optimizer).__name__ == "Adam"  # fairseq's own (no apex on a CPU)
    adam = CapturableAdam(ElectraAdam.groups(list(model.parameters()), cfg),
                          **eager.optimizer_config)
    step = GraphedStep(model.electra_step, backend)
    step.combine = functools.partial(criterion.combine, model)
    update = WholeUpdate(step, adam, CLIP, backend=backend, window=4)

    fairseq_count = host_count = 0
    with torch._dynamo.config.patch(error_on_recompile=True):
        for number in range(UPDATES):
            micro_batches = batches(task, number, device)
            before = [p.detach().clone() for p in model.parameters()]
            eager.set_lr(lr_at(fairseq_count))
            torch.manual_seed(100 + number)  # fairseq's seed before each update
            losses, eager_norm, stepped = eager_update(eager_model, eager_criterion, eager,
                                                       micro_batches)
            fairseq_count += stepped
            # the host sets the lr at its own count: one ahead after the skip until READ
            update.set_lr(host_count, [lr_at(host_count) * g["lr_scale"]
                                       for g in adam.param_groups])
            torch.manual_seed(100 + number)
            with HostWork() as work:
                fields, norm, found_inf = update(micro_batches)
            host_count += 1
            assert work.syncs == 0
            if device == "cpu":  # every kernel issued by the compiled code
                assert work.kernels == work.graph_kernels > 0
            elif number > 1:  # (0: the warm-up, 1: the capture) replayed: the compiled code
                # issues nothing; the host copies the batch in and the outputs out
                assert work.graph_kernels == 0 < work.kernels
            assert float(found_inf) == (not stepped) == (number == OVERFLOW)
            if stepped:
                torch.testing.assert_close(norm, eager_norm, rtol=tolerance["rtol"], atol=0)
                torch.testing.assert_close(torch.stack([f["loss"] for f in fields]),
                                           torch.stack(losses), rtol=tolerance["rtol"], atol=0)
                assert adam.lr.tolist() == [g["lr"] for g in eager.param_groups]
            else:  # nothing moved
                assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
            if number == READ:  # the host reads the flags, as at --log-interval
                assert update.late.tolist() == [1]
                update.skips_read()
                host_count -= 1
            for p, q in zip(model.parameters(), eager_model.parameters()):
                torch.testing.assert_close(p, q, rtol=0, atol=tolerance["weights"],
                                           msg=lambda m: f"{number}: {m}")

    assert fairseq_count == host_count == UPDATES - 1
    assert adam.steps.tolist() == [fairseq_count] * len(adam.groups)
    states = [(adam.state[p], eager.optimizer.state[q])
              for p, q in zip(model.parameters(), eager_model.parameters())]
    for key in ("exp_avg", "exp_avg_sq"):
        # judged against the model's largest: a tensor whose exact gradient is 0 (the key
        # bias: softmax ignores it) holds rounding noise in both
        scale = max(theirs[key].abs().max().item() for _, theirs in states)
        for mine, theirs in states:
            torch.testing.assert_close(mine[key], theirs[key], rtol=0,
                                       atol=tolerance["moments"] * scale)
    for mine, theirs in states:
        assert int(mine["step"]) == theirs["step"] == fairseq_count
    model.discriminator.embeddings.register_forward_hook(lambda *args: None)
    with pytest.raises(ElectraUsageError, match="hooks changed after its step was captured"):
        update(batches(task, UPDATES, device))
    start, _, _ = built(device)
    assert max((p - q).abs().max().item()
               for p, q in zip(model.parameters(), start.parameters())) > 1e-2  # (it trained)


@pytest.mark.slow  # (dynamo's compile of the whole update: ~15 s on 2 cores)
def test_the_whole_update_is_fairseqs_eager_update_without_a_host_sync(monkeypatch):
    """Weights, Adam's moments, step counts and lrs equal to fairseq's after each update (the
    skipped one moves nothing, within ``TOLERANCE``); every kernel of an update issued by the
    compiled code, none a host sync (HostWork counts each aten operator at the dispatcher,
    ``.item()``, ``bool()`` and ``.tolist()`` included: their ``_local_scalar_dense``); no
    recompile for a new lr, count or overflow. A model changed after the capture is refused
    at the next check, as the graphed step's."""
    check_against_eager(monkeypatch, "cpu", "aot_eager")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_whole_update_replays_one_cuda_graph_equal_to_fairseqs_update(
        monkeypatch):
    """As on the CPU, with aot_eager's code replayed as one CUDA graph (update 1 the warm-up,
    2 captured, 3-10 replayed, the overflow among them): each replay moves the weights,
    moments and counts once, at the lr of its row, without a host sync (the capture
    synchronizes once, outside aten: HostWork does not count it). Inductor on a GPU keeps
    the step's backward out of its graph, so it refuses the whole update in one line."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # (a GPU run's)
    model, _, criterion = built("cuda")
    step = GraphedStep(model.electra_step, "inductor")
    step.combine = functools.partial(criterion.combine, model)
    adam = CapturableAdam([{"params": list(model.parameters())}], lr=1e-3)
    with pytest.raises(ElectraUsageError, match="not inductor on a GPU"):
        WholeUpdate(step, adam, CLIP, backend="inductor", window=4)
    check_against_eager(monkeypatch, "cuda", "aot_eager")


def test_an_adam_without_every_trained_parameter_is_refused():
    model, _, criterion = built()
    step = GraphedStep(model.electra_step, "aot_eager")
    step.combine = functools.partial(criterion.combine, model)
    adam = CapturableAdam(list(model.parameters())[1:], lr=1e-3)
    with pytest.raises(ElectraUsageError, match="exactly the parameters the step trains"):
        WholeUpdate(step, adam, CLIP, backend="aot_eager", window=2)


def whole_update_cmd(data_bin, root, name, updates, *extra):
    """A train_cmd that can take the whole update (with ``--graphed-step`` among ``extra``):
    electra_adam, --update-freq 2, the clip, the weight decay, a warm-up and decay, an overflow
    skipped, logs read every 4 updates; its checkpoints in ``root / name``."""
    line = train_cmd(data_bin, root / name, "--disable-validation", "--no-epoch-checkpoints",
                     "--train-subset", "valid", "--update-freq", "2", "--max-update",
                     str(updates), "--clip-norm", "1.0", "--weight-decay", "0.01",
                     "--adam-eps", "1e-6", "--skip-nonfinite-updates", "1",
                     "--num-layers", "1", *extra)  # one layer: the step compiles faster
    line[line.index("--optimizer") + 1] = "electra_adam"
    line[line.index("--log-interval") + 1] = "4"
    return line


POISONED_AT = 2  # the host's update count whose first micro-batch gets an infinite weight


def poisoned_run(cmd, monkeypatch, caplog):
    """fairseq-train in this process, the first micro-batch at host count ``POISONED_AT``
    given an infinite weight as the trainer prepares it (either update path reads it there)
    -> its log."""
    original = Trainer._prepare_sample
    done = []

    def prepare(trainer, sample, *args, **kwargs):
        sample, dummy = original(trainer, sample, *args, **kwargs)
        if trainer.get_num_updates() == POISONED_AT and not done:
            done.append(True)
            weights = sample["net_input"]["masked_weights"].clone()
            weights[0] = float("inf")
            sample["net_input"]["masked_weights"] = weights
        return sample, dummy

    monkeypatch.setattr(Trainer, "_prepare_sample", prepare)
    caplog.set_level(logging.INFO)
    caplog.clear()
    train_in_process(cmd)
    return "\n".join(r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_through_fairseq_train_the_checkpoint_is_the_eager_runs_and_resumes(
        data_bin, tmp_path, monkeypatch, caplog):
    """fairseq-train with --graphed-step and electra_adam (--update-freq 2, a warm-up and
    decay, the clip, an overflow skipped by --skip-nonfinite-updates 1) takes the whole
    update (with fairseq's adam it says in one line why not); its checkpoint holds the eager
    run's weights, Adam moments, step counts, lr and update count (fairseq's Adam's state),
    and a run resumed from its checkpoint at update 4 ends where it does, bit for bit.
    Tolerances (measured 6e-8 on the weights, 7e-8 of the largest moment): the eager run's
    backward and its Adam (torch's fused kernel on a CPU, eps placed after the bias
    correction) round differently from the graph's."""
    monkeypatch.setenv(VARIABLE, "-dropout")  # both draw dropout from torch's generator
    cmd = functools.partial(whole_update_cmd, data_bin, tmp_path)
    # a checkpoint at update 4: the resume's start
    graphed = ("--graphed-step", "--torch-compile", "aot_eager", "--save-interval-updates", "4")
    log = poisoned_run(cmd("whole", 8, *graphed), monkeypatch, caplog)
    assert "the whole update (each micro-batch's forward and backward, the clip, Adam) " \
           "runs as one compiled graph (aot_eager)" in log
    assert "skipped update 3" in log
    eager_log = poisoned_run(cmd("eager", 8), monkeypatch, caplog)
    assert "whole update" not in eager_log and "skipped update 3" in eager_log
    whole, eager = (checkpoint(tmp_path / name / "checkpoint_last.pt")
                    for name in ("whole", "eager"))
    assert whole["optimizer_history"][-1]["num_updates"] == \
        eager["optimizer_history"][-1]["num_updates"] == 8
    assert whole["optimizer_history"][-1]["lr_scheduler_state"] == \
        eager["optimizer_history"][-1]["lr_scheduler_state"]
    for name, tensor in eager["model"].items():
        torch.testing.assert_close(whole["model"][name], tensor, rtol=0, atol=1e-6)
    ours, theirs = whole["last_optimizer_state"], eager["last_optimizer_state"]
    assert [g["lr"] for g in ours["param_groups"]] == [g["lr"] for g in theirs["param_groups"]]
    assert ours["state"].keys() == theirs["state"].keys()
    for key in ("exp_avg", "exp_avg_sq"):
        scale = max(s[key].abs().max().item() for s in theirs["state"].values())
        for index, state in theirs["state"].items():
            assert ours["state"][index]["step"] == state["step"] == 8
            torch.testing.assert_close(ours["state"][index][key], state[key], rtol=0,
                                       atol=1e-6 * scale)

    plain_adam = cmd("plain", 1, *graphed)
    plain_adam[plain_adam.index("--optimizer") + 1] = "adam"
    log = poisoned_run(plain_adam, monkeypatch, caplog)
    assert log.count("the whole update as one graph is off: it needs electra_adam") == 1
    assert "runs as one compiled graph (aot_eager" in log  # the graphed step's own

    (tmp_path / "resumed").mkdir()
    shutil.copy(next((tmp_path / "whole").glob("checkpoint_*_4.pt")),
                tmp_path / "resumed" / "checkpoint_last.pt")
    assert "Loaded checkpoint" in poisoned_run(cmd("resumed", 8, *graphed), monkeypatch, caplog)
    resumed = checkpoint(tmp_path / "resumed" / "checkpoint_last.pt")
    assert resumed["optimizer_history"][-1]["num_updates"] == 8
    for name, tensor in whole["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_fairseq_train_with_the_replay_part_replays_the_whole_update(
        data_bin, tmp_path, monkeypatch, caplog):
    """fairseq-train on a GPU with --graphed-step and ELECTRA_SPEED=+replay takes the whole
    update and captures it as one CUDA graph at its second update; the skipped overflow is
    logged and the checkpoint holds 8 updates of finite weights. Without the part the run
    keeps fairseq's update and says why in one line. (aot_eager: seconds of compiling; the
    capture takes its aten ops as it takes inductor's kernels, which the test above runs.)"""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # (restored after)
    monkeypatch.setenv(VARIABLE, "+replay")
    graphed = ("--graphed-step", "--torch-compile", "aot_eager")
    cmd = [c for c in whole_update_cmd(data_bin, tmp_path, "replayed", 8, *graphed)
           if c != "--cpu"]
    log = poisoned_run(cmd, monkeypatch, caplog)
    assert "the whole update (each micro-batch's forward and backward, the clip, Adam) " \
           "runs as one compiled graph (aot_eager, replayed as one CUDA graph)" in log, log
    assert log.count("the whole update is captured as one CUDA graph") == 1, log
    assert "skipped update 3" in log, log
    state = checkpoint(tmp_path / "replayed" / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["num_updates"] == 8
    assert all(torch.isfinite(v).all() for v in state["model"].values())

    monkeypatch.setenv(VARIABLE, "1")
    log = poisoned_run([c for c in whole_update_cmd(data_bin, tmp_path, "off", 1, *graphed)
                        if c != "--cpu"], monkeypatch, caplog)
    assert log.count("the whole update as one graph is off: on a GPU its CUDA graph is tried "
                     "only with ELECTRA_SPEED=+replay (it ran over aot_eager on an H200, "
                     "untimed)") == 1, log
