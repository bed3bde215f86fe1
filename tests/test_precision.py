"""Mixed precision that trains correctly: --amp's update, fp32 heads, buffers kept in their
dtype, and --fp16's flattening, on CPU with fairseq's own classes (a CPU GradScaler stands in
for the CUDA one, which switches itself off without a GPU)."""

import pytest
import torch
from fairseq import optim
from fairseq.optim.fp16_optimizer import FP16Optimizer
from omegaconf import open_dict

from electra_plugin.environment import bf16_units
from electra_plugin.metrics.auc import auc_from_counts, auc_pair_counts
from electra_plugin.models.core.heads import ElectraDiscriminatorPredictions
from electra_plugin.models.core.run_config import complete_for_model
from electra_plugin.models.electra import init_bert_params
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import (
    adam_cfg, amp_optimizer, built_from_command_line, masked_batch, one_update, tiny_model,
)


@pytest.mark.parametrize("name", ["electra_adam", "adam"])
def test_amp_update_equals_fp32_update(name):
    """fairseq's --amp divides the gradients by the loss scale twice (see optim/amp.py);
    through the plugin's task the update is fp32's, bit for bit on CPU (no autocast there,
    and a power-of-two scale is exact)."""
    # three identical models (deepcopy would drop the parameters' weight-decay tags)
    (reference, task), (fixed, _), (fairseq_own, _) = (
        tiny_model(dropout=0.0, attention_dropout=0.0) for _ in range(3))
    fp32 = optim.build_optimizer(adam_cfg(name), list(reference.parameters()))
    one_update(reference, task, fp32, lambda o: task.optimizer_step(o, reference, 0), amp=False)

    amp = amp_optimizer(name, list(fixed.parameters()), scale=128.0)
    one_update(fixed, task, amp, lambda o: task.optimizer_step(o, fixed, 0), amp=True)
    for (key, a), b in zip(reference.named_parameters(), fixed.parameters()):
        assert torch.equal(a, b), key
    assert amp.scaler.get_scale() == 128.0  # no overflow: the scale stays until its window

    # fairseq's own AMPOptimizer.step still unscales twice: Adam's eps then weighs 128x
    # more and the update differs (if this starts failing, fairseq fixed it)
    own = amp_optimizer(name, list(fairseq_own.parameters()), scale=128.0)
    one_update(fairseq_own, task, own, lambda o: o.step(), amp=True)
    assert any(not torch.equal(a, b) for a, b in zip(reference.parameters(),
                                                     fairseq_own.parameters()))


def collapsed_batch(rows=8, length=32, hidden=64):
    """Features of a discriminator that has collapsed: every token within a small spread of
    one vector (values exact in bf16), and labels that the fp32 scores rank better than
    chance. -> (head with bf16-exact weights, hidden B x T x H, replaced, covered)."""
    torch.manual_seed(0)
    head = ElectraDiscriminatorPredictions(hidden)
    head.apply(init_bert_params)
    head.dense_prediction.bias.data.fill_(-2.0)  # near the logit an early run has
    head = head.bfloat16().float()
    base = torch.randn(hidden)
    features = (base + 0.05 * torch.randn(rows, length, hidden)).bfloat16().float()
    with torch.no_grad():
        score = head(features)
    replaced = (score - score.median() + 0.002 * torch.randn(rows, length)) > 0.0015
    return head, features, replaced, torch.ones(rows, length, dtype=torch.bool)


def auc(logits, replaced, covered):
    return auc_from_counts(auc_pair_counts(logits, replaced, covered))


def test_replaced_token_logits_and_auc_are_fp32_under_bf16():
    head, features, replaced, covered = collapsed_batch()
    with torch.no_grad():
        full = head(features)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = head(features)
        bf16_weights = head.bfloat16()(features.bfloat16())
    assert full.max() - full.min() < 0.05  # collapsed: bf16 (spacing 1/64 at 2) ties it
    fp32_auc = auc(full, replaced, covered)
    assert fp32_auc > 0.6
    assert auc(full.bfloat16(), replaced, covered) == 0.5  # what half-precision logits gave
    for logits in (autocast, bf16_weights):
        assert logits.dtype == torch.float32
        assert torch.equal(logits, full)
        assert auc(logits, replaced, covered) == fp32_auc


def test_pretraining_outputs_are_fp32_whatever_the_weights():
    model, task = tiny_model()
    src, target, _, _ = masked_batch(task)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(src, target=target)
    half = model.bfloat16()(src, target=target)
    for o in (out, half):
        assert o.main.dtype == o.generator_log_probs.dtype == torch.float32


def test_cast_keeps_the_unigram_table_and_the_flops_count():
    model, _ = tiny_model(generator="unigram")
    table = model.unigram.log_probs.clone()
    model.flops_counter.add(1.2345678901234e18)
    for cast in (torch.nn.Module.bfloat16, torch.nn.Module.half):
        cast(model)
        assert model.unigram.log_probs.dtype == torch.float32
        assert torch.equal(model.unigram.log_probs, table)
        assert model.flops_counter.flops.dtype == torch.float64
        assert model.flops_counter.flops.item() == 1.2345678901234e18
        assert next(model.parameters()).dtype != torch.float32  # the weights were cast


def test_fp16_keeps_the_weight_decay_exemption_and_layer_decay(data_bin):
    """fairseq's --fp16 would flatten the fp32 master weights into one tensor; for ELECTRA
    models with electra_adam the plugin keeps them per parameter."""
    cfg, _, model = built_from_command_line(data_bin, "--fp16", "--layer-decay", "0.8")
    assert cfg.common.fp16_no_flatten_grads is True
    optimizer = FP16Optimizer.build_optimizer(cfg, list(model.parameters()))
    groups = optimizer.fp32_optimizer.param_groups
    no_decay = {id(p) for g in groups if g["weight_decay"] == 0 for p in g["params"]}
    fp32_copies = [p for g in groups for p in g["params"]]
    assert len(fp32_copies) == len(list(model.parameters()))
    assert len({g["lr_scale"] for g in groups}) == model.cfg.num_layers + 2  # + heads, embeddings
    for p32, (name, _) in zip(optimizer.fp32_params, model.named_parameters()):
        exempt = "LayerNorm" in name or name.endswith("bias")
        assert (id(p32) in no_decay) == exempt, name


def test_flat_fp16_on_the_cpu_is_one_line(data_bin):
    """fairseq's FP16Optimizer builds its flat fp32 copy with torch.cuda.current_device():
    on the CPU the run is refused when the model is built, before fairseq gets there, naming
    what trains instead; --fp16-no-flatten-grads, --memory-efficient-fp16 and electra_adam
    (kept per parameter) build no flat copy and go on."""
    with pytest.raises(ElectraUsageError) as refused:
        built_from_command_line(data_bin, "--fp16", "--optimizer", "adam")
    line = str(refused.value)
    for phrase in ("--fp16 on the CPU", "CUDA device", "fp32", "--autocast-bf16",
                   "electra-train --bf16", "--fp16-no-flatten-grads"):
        assert phrase in line, line
    assert "\n" not in line
    cfg, _, _ = built_from_command_line(data_bin, "--fp16", "--optimizer", "adam",
                                        "--fp16-no-flatten-grads")
    with open_dict(cfg):
        cfg.common.fp16_no_flatten_grads, cfg.common.memory_efficient_fp16 = False, True
        complete_for_model(cfg)
        cfg.common.memory_efficient_fp16, cfg.optimizer._name = False, "electra_adam"
        complete_for_model(cfg)
    assert cfg.common.fp16_no_flatten_grads is True


def test_bf16_without_bf16_units_is_said_once(data_bin, tmp_path, monkeypatch, caplog):
    """bf16 pays only where the hardware multiplies it. On a CPU /proc/cpuinfo's flags decide
    (here files written in its format; one that lists no flags, as off Linux, is not
    judged); a run asking for bf16 where they lack is warned once, naming fp32."""
    cfg, _, _ = built_from_command_line(data_bin, "--autocast-bf16")
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(bf16_units, "CPUINFO", str(cpuinfo))
    for flags, autocast, warned in (("fpu avx2 avx512f", True, True),
                                    ("fpu avx2 avx512f", False, False),
                                    ("fpu avx512f avx512_bf16", True, False),
                                    ("fpu amx_bf16 amx_tile", True, False), (None, True, False)):
        cpuinfo.write_text("processor\t: 0\n" + (f"flags\t\t: {flags}\n" if flags else ""))
        caplog.clear()
        with open_dict(cfg), caplog.at_level("WARNING"):
            cfg.task.autocast_bf16 = autocast
            complete_for_model(cfg)
        said = [r.getMessage() for r in caplog.records if "bf16 is emulated" in r.getMessage()]
        assert said == (["--autocast-bf16: this CPU has neither amx_bf16 nor avx512_bf16, so "
                         "bf16 is emulated and slower than fp32 (several times); train in fp32 "
                         "(no precision flag) here (docs/long_runs.md, \"Which one\")"]
                        if warned else []), (flags, autocast, said)


def test_fully_sharded_is_one_line(data_bin):
    with pytest.raises(ElectraUsageError, match="fully_sharded .* use --ddp-backend c10d"):
        built_from_command_line(data_bin, "--ddp-backend", "fully_sharded")


@pytest.mark.parametrize("backend, expected", [("c10d", True), ("legacy_ddp", False)])
def test_two_stage_under_torch_ddp_looks_for_unused_parameters(data_bin, backend, expected):
    cfg, _, _ = built_from_command_line(data_bin, "--generator", "two_stage",
                                        "--two-stage-updates", "5",
                                        "--distributed-world-size", "2", "--ddp-backend",
                                        backend, cpu=False)  # (a GPU run's)
    assert cfg.distributed_training.find_unused_parameters is expected


@pytest.mark.parametrize("backend", [[], ["--ddp-backend", "c10d"],
                                     ["--ddp-backend", "pytorch_ddp"]])
def test_cpu_processes_take_fairseqs_legacy_ddp(data_bin, backend, caplog):
    """fairseq builds torch's DDP (its default backend) with a CUDA device id, which a CPU
    module refuses deep inside torch: CPU processes get fairseq's legacy DDP, said once."""
    with caplog.at_level("INFO"):
        cfg, _, _ = built_from_command_line(data_bin, "--distributed-world-size", "2",
                                            *backend)
    assert cfg.distributed_training.ddp_backend == "legacy_ddp"
    assert "--ddp-backend legacy_ddp" in caplog.text
    one, _, _ = built_from_command_line(data_bin, *backend)  # one process: no wrapper
    gpus, _, _ = built_from_command_line(data_bin, "--distributed-world-size", "2", *backend,
                                         cpu=False)
    assert one.distributed_training.ddp_backend == gpus.distributed_training.ddp_backend == \
        (backend[1] if backend else "pytorch_ddp")


@pytest.mark.parametrize("flag, tf32", [((), True), (("--no-tf32",), False)])
def test_cuda_training_uses_tf32_unless_told_not_to(data_bin, flag, tf32):
    _, task, _ = built_from_command_line(data_bin, *flag)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        task.set_up_device("cuda")  # what the first update on a GPU does (flags only)
        assert torch.backends.cuda.matmul.allow_tf32 is tf32
        assert torch.backends.cudnn.allow_tf32 is tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
