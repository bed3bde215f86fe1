"""Layer-wise lr decay: the learning rate each parameter actually gets."""

import pytest
import torch
from fairseq import optim
from fairseq.optim.lr_scheduler import build_lr_scheduler
from omegaconf import OmegaConf

from electra_plugin.user_io.errors import ElectraUsageError
from helpers import electra_adam_cfg, masked_batch, tiny_model


def expected_scale(name, num_layers, decay):
    if name.startswith("discriminator.embeddings"):
        return decay ** (num_layers + 1)
    if name.startswith("discriminator.encoder.layer."):
        return decay ** (num_layers - int(name.split(".")[3]))
    return 1.0


def build(model, decay, weight_decay=0.0):
    cfg = electra_adam_cfg(layer_decay=decay, weight_decay=weight_decay)
    return optim.build_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])


def test_first_adam_step_moves_each_parameter_by_its_scaled_lr():
    model, task = tiny_model(dropout=0.0, attention_dropout=0.0)
    model.register_classification_head("cls", num_classes=3)
    optimizer = build(model, decay=0.8)
    sched_cfg = OmegaConf.create({"_name": "polynomial_decay", "warmup_updates": 4,
                                  "total_num_update": 20, "end_learning_rate": 0.0,
                                  "power": 1.0, "force_anneal": None, "lr": [1e-3]})
    scheduler = build_lr_scheduler(sched_cfg, optimizer)
    scheduler.step_update(2)  # halfway through warmup
    base = optimizer.get_lr()
    assert base == pytest.approx(0.5e-3)

    src, _, _, _ = masked_batch(task)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    logits, _ = model(src, classification_head_name="cls")
    # scaled up so that most gradients clear Adam's eps (the head's N(0, 0.02) init makes
    # them small); Adam's first step does not depend on the scale otherwise
    (1e3 * torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2]))).backward()
    optimizer.step()

    checked = 0
    for name, p in model.named_parameters():
        if p.grad is None or name.startswith(("generator", "discriminator_head")):
            continue
        moved = (p.detach() - before[name]).abs()
        big = p.grad.abs() > 1e-4  # Adam moves these by lr * g / |g| on its first step
        if not big.any():
            continue
        lr = base * expected_scale(name, 2, 0.8)
        assert torch.allclose(moved[big], torch.full_like(moved[big], lr), rtol=1e-2), name
        checked += 1
    assert checked > 20


def test_groups_exempt_layernorm_and_bias_from_weight_decay():
    model, _ = tiny_model()
    optimizer = build(model, decay=0.9, weight_decay=0.01)
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        group = group_of[id(p)]
        exempt = "LayerNorm" in name or name.endswith("bias")
        assert group["weight_decay"] == (0.0 if exempt else 0.01), name
        assert group["lr_scale"] == pytest.approx(expected_scale(name, 2, 0.9)), name


def test_flattened_fp16_parameters_are_rejected_with_layer_decay():
    flat = torch.nn.Parameter(torch.zeros(10))
    with pytest.raises(ElectraUsageError, match="--fp16-no-flatten-grads"):
        optim.build_optimizer(electra_adam_cfg(layer_decay=0.8), [flat])
