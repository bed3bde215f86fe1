"""What only a CUDA GPU can show, run first on a GPU machine with ``pytest -m gpu``: every
precision against fp32 over a few updates of electra_adam, --graphed-step against the eager
step, --amp's update with the real CUDA GradScaler, two-stage freezing, a run forked from the
warm server. (Compile: tests/test_compile.py; evaluation on the GPU: the GLUE and SQuAD
tests.) Skipped without CUDA; the CPU emulations of each are in
test_precision.py, test_training.py and test_compile.py."""

import math
import os
import re

import pytest
import torch
from fairseq import optim

from electra_plugin.speed.launch import ForkedRun, start_fairseq_train

from helpers import (
    DISC_WEIGHT, adam_cfg, amp_optimizer, checkpoint, failure, hydra_train, masked_batch,
    one_update, records, run, tiny_model, train_cmd,
)


pytestmark = [pytest.mark.gpu, pytest.mark.slow,  # most run fairseq-train
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# a deterministic step (no dropout, argmax sampling), so that precisions differ by rounding
DETERMINISTIC = ("--dropout", "0", "--attention-dropout", "0", "--temperature", "0",
                 "--optimizer", "electra_adam", "--weight-decay", "0.01", "--clip-norm", "1.0",
                 "--max-update", "4", "--disable-validation")
# how far each precision's logged values may sit from fp32's over 4 updates
TOLERANCE = {"fp16": {"gen_loss": 0.02, "disc_loss": 0.005, "disc_auc": 0.05},
             "amp": {"gen_loss": 0.02, "disc_loss": 0.005, "disc_auc": 0.05},
             "bf16": {"gen_loss": 0.1, "disc_loss": 0.02, "disc_auc": 0.1},
             "autocast-bf16": {"gen_loss": 0.05, "disc_loss": 0.01, "disc_auc": 0.1}}


def gpu_train(data, save_dir, *flags):
    cmd = [c for c in train_cmd(data, save_dir, *DETERMINISTIC, *flags) if c != "--cpu"]
    if "--bf16" in flags:  # fairseq-train turns --bf16 into --tpu; electra-train does not
        cmd[1:3] = ["-m", "electra_plugin.cli.train"]
    result = run(cmd)
    assert result.returncode == 0, failure(f"GPU training {flags}", result)
    assert re.search(r"rank\s+0: capabilities =", result.stdout), "not on CUDA"
    return result.stdout


@pytest.fixture(scope="module")
def fp32_run(data_bin, tmp_path_factory):
    return records(gpu_train(data_bin, tmp_path_factory.mktemp("fp32")))


@pytest.mark.parametrize("precision", sorted(TOLERANCE))
def test_each_precision_trains_like_fp32(precision, fp32_run, data_bin, tmp_path):
    logs = records(gpu_train(data_bin, tmp_path, f"--{precision}"))
    assert [r["num_updates"] for r in logs] == [r["num_updates"] for r in fp32_run]
    for low, full in zip(logs, fp32_run):
        assert all(math.isfinite(low[k]) for k in ("loss", "gen_loss", "disc_loss")), low
        assert abs(low["loss"] - (low["gen_loss"] + DISC_WEIGHT * low["disc_loss"])) <= 0.05
        for key, atol in TOLERANCE[precision].items():
            assert abs(low[key] - full[key]) <= atol, (precision, key, low, full)
        assert ("loss_scale" in low) == (precision in ("fp16", "amp")), low
    state = checkpoint(tmp_path / "checkpoint_last.pt")
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert state["cfg"]["common"]["tpu"] is False


@pytest.mark.parametrize("switch", ["1", "-cudagraphs"])
def test_the_graphed_step_trains_like_the_eager_step(switch, fp32_run, data_bin, tmp_path,
                                                     monkeypatch):
    """--graphed-step on CUDA (inductor: the forward and autograd's backward as two graphs,
    each kind of layer traced once, replayed as CUDA graphs: update 1 compiles and captures,
    2-4 replay; with ELECTRA_SPEED=-cudagraphs inductor's kernels launched one by one) logs
    what the eager step logs."""
    monkeypatch.setenv("ELECTRA_SPEED", switch)
    out = gpu_train(data_bin, tmp_path, "--graphed-step")
    assert "the step runs as one compiled graph" in out, out[-3000:]
    assert ("CUDA graphs" in out) == ("-cudagraphs" not in switch)
    assert "gradients inside" not in out and "each kind of layer traced once" in out
    logs = records(out)
    assert [r["num_updates"] for r in logs] == [r["num_updates"] for r in fp32_run]
    for graphed, eager in zip(logs, fp32_run):
        for key, atol in TOLERANCE["amp"].items():  # fused kernels round like TF32 does
            assert abs(graphed[key] - eager[key]) <= atol, (key, graphed, eager)


def test_cuda_graph_replays_draw_fresh_random_numbers_under_the_seed():
    """Each replay of the CUDA-graphed step (with inductor on a GPU its backward a second
    graph, though the task asks for the gradients inside) draws new dropout masks and
    generator samples (not the captured ones again),
    and the same ones after the same ``torch.manual_seed`` (fairseq reseeds every update):
    the losses of one batch on fixed weights tell. A batch of fewer rows then runs eager."""
    from electra_plugin.data.masking import max_predictions, prediction_slots
    from electra_plugin.speed.compile import compile_step

    model, task = tiny_model()  # dropout 0.1, sampling at temperature 1
    model.cuda().train()
    src, target, _, picked = masked_batch(task)
    positions, weights = prediction_slots(picked, max_predictions(0.15, src.size(1)))
    src, target, positions, weights = (t.cuda() for t in (src, target, positions, weights))
    assert compile_step(model, "inductor")
    model.electra_step.combine = lambda out: DISC_WEIGHT * out.main_loss + out.generator_loss

    def loss(seed=None):
        if seed is not None:
            torch.manual_seed(seed)
        return float(model(src, target=target, masked_positions=positions,
                           masked_weights=weights, has_padding=True).main_loss)

    replays = [loss() for _ in range(4)][1:]  # the first compiles and captures
    assert model.electra_step.cudagraphs and model.electra_step.params is None
    assert all(abs(a - b) > 1e-5 * abs(b) for a, b in zip(replays, replays[1:])), replays
    assert loss(7) == pytest.approx(loss(7), rel=1e-5)
    assert abs(loss(7) - loss(8)) > 1e-5 * abs(loss(8))
    # a batch of fewer rows (an epoch's last) runs eager: no second compile and capture
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    short = prediction_slots(picked[:2], max_predictions(0.15, src.size(1)))
    out = model(src[:2], target=target[:2], masked_positions=short[0].cuda(),
                masked_weights=short[1].cuda(), has_padding=True)
    assert torch.isfinite(out.main_loss)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_cuda_graphs_accumulate_gradients_over_update_freq(data_bin, tmp_path):
    """With --update-freq 2 the CUDA graph's replay writes its gradients into the same
    output buffers twice: they must add up (g1 + g2), as the eager step's do, not alias."""
    flags = ("--update-freq", "2")
    eager = records(gpu_train(data_bin, tmp_path / "eager", *flags))
    graphed = records(gpu_train(data_bin, tmp_path / "graphed", *flags, "--graphed-step"))
    assert [r["num_updates"] for r in graphed] == [r["num_updates"] for r in eager]
    for g, e in zip(graphed, eager):
        assert g["gnorm"] == pytest.approx(e["gnorm"], rel=0.02), (g, e)
        for key, atol in TOLERANCE["amp"].items():
            assert abs(g[key] - e[key]) <= atol, (key, g, e)


@pytest.mark.parametrize("body", ["deberta", "modern"])
def test_each_body_trains_in_bf16_like_fp32(body, data_bin, tmp_path):
    """The DeBERTa and modern bodies under --bf16 (electra-train) against their own fp32."""
    body_flags = ("--encoder-body", body)
    full = records(gpu_train(data_bin, tmp_path / "fp32", *body_flags))
    low = records(gpu_train(data_bin, tmp_path / "bf16", *body_flags, "--bf16"))
    assert [r["num_updates"] for r in low] == [r["num_updates"] for r in full]
    for a, b in zip(low, full):
        for key, atol in TOLERANCE["bf16"].items():
            assert math.isfinite(a[key]) and abs(a[key] - b[key]) <= atol, (body, key, a, b)


def test_hydra_bf16_on_gpu(data_bin, tmp_path):
    stdout, save_dir = hydra_train(tmp_path, data_bin, "optimization.max_update=2",
                                   "common.bf16=true", cpu=False)
    assert [r["num_updates"] for r in records(stdout)] == [1, 2]
    assert checkpoint(save_dir / "checkpoint_last.pt")["cfg"]["common"]["bf16"] is True


@pytest.mark.parametrize("name", ["electra_adam", "adam"])
def test_amp_update_equals_fp32_update_with_the_cuda_scaler(name):
    """test_precision's check with fairseq's AMPOptimizer as it is (its CUDA GradScaler)."""
    (reference, task), (fixed, _) = (tiny_model(dropout=0.0, attention_dropout=0.0)
                                     for _ in range(2))
    reference.cuda(), fixed.cuda()
    fp32 = optim.build_optimizer(adam_cfg(name), list(reference.parameters()))
    one_update(reference, task, fp32, lambda o: task.optimizer_step(o, reference, 0), amp=False)
    amp = amp_optimizer(name, list(fixed.parameters()), scale=128.0)
    one_update(fixed, task, amp, lambda o: task.optimizer_step(o, fixed, 0), amp=True)
    for (key, a), b in zip(reference.named_parameters(), fixed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7, msg=key)


def test_two_stage_generator_frozen_on_gpu(data_bin, tmp_path):
    options = ("--generator", "two_stage", "--two-stage-updates", "2", "--amp")
    gpu_train(data_bin, tmp_path, *options)  # updates 1-2 stage 1, 3-4 stage 2
    state = checkpoint(tmp_path / "checkpoint_last.pt")["model"]
    assert bool(state["second_stage"])
    # the discriminator started as the generator and trained; the generator did not move:
    # its copy in the discriminator at the switch is gone, so compare against a stage-1 run
    stage_one = tmp_path / "stage_one"
    gpu_train(data_bin, stage_one, *options, "--max-update", "2")
    before = checkpoint(stage_one / "checkpoint_last.pt")["model"]
    generator = [k for k in state if k.startswith(("generator.", "generator_head."))]
    assert all(torch.equal(state[k].cpu(), before[k].cpu()) for k in generator)


def test_a_run_forked_from_the_warm_server_trains_on_the_gpu(data_bin, tmp_path):
    """Trials and the comparison's arms start from a fork server that imported torch and
    fairseq (speed/launch.py), whose import asks torch for the device count: the forked run
    still initialises CUDA and trains there."""
    cmd = [c for c in train_cmd(data_bin, tmp_path, *DETERMINISTIC) if c != "--cpu"]
    log_path = tmp_path / "train.log"
    with open(log_path, "w") as log:
        proc = start_fairseq_train(cmd, log, dict(os.environ))
    assert isinstance(proc, ForkedRun) and proc.wait() == 0, log_path.read_text()[-3000:]
    text = log_path.read_text()
    assert re.search(r"rank\s+0: capabilities =", text), "not on CUDA"
    assert records(text)[-1]["num_updates"] == 4


def test_the_step_does_not_wait_for_the_gpu():
    """With the collater's masked_positions and has_padding, the pre-training step (forward,
    loss, backward) makes no host-device synchronisation."""
    model, task = tiny_model()
    src, target, _, picked = (t.cuda() for t in masked_batch(task))
    positions = picked.flatten().nonzero().squeeze(1)
    model.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = model(src, target=target, masked_positions=positions, has_padding=True)
        loss = out.generator_loss + 50.0 * out.main_loss
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss)


def test_unpadded_attention_on_cuda_matches_the_padded_grid(monkeypatch):
    """The modern body in bf16 on CUDA: unpadded (flash attention's varlen kernel when
    flash_attn is installed, SDPA over the re-padded rows otherwise) against the padded
    grid, over the real tokens."""
    from electra_plugin.speed import unpad

    model, _ = tiny_model(encoder_body="modern")
    encoder = model.discriminator.cuda().to(torch.bfloat16).eval()
    tokens = torch.randint(5, 50, (4, 48), device="cuda")
    for row, length in enumerate((48, 30, 17, 5)):
        tokens[row, length:] = 1
    real = tokens.ne(1)
    outputs = {}
    for speed in ("1", "0"):
        monkeypatch.setenv("ELECTRA_SPEED", speed)
        with torch.no_grad():
            outputs[speed] = encoder(tokens)[0].float()
    print(f"\nflash_attn varlen: {unpad.flash_attn_varlen_func is not None}")
    assert (outputs["1"] - outputs["0"])[real].abs().max() < 0.05  # bf16 rounding
