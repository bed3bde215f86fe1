"""Fast-ELECTRA (--generator fast_electra): an existing masked LM, frozen, sampled at a
temperature that decays over training."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from electra_plugin.criterions.electra import ElectraCriterion
from electra_plugin.models.core.checkpoint import write_checkpoint
from electra_plugin.models.core.config import complete_config
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import (make_task, records, run_here, sample_for, tiny_model, tiny_model_config,
                     train_cmd)


def saved_masked_lm(path, task, **options):
    """A plugin checkpoint of a tiny model built with ``options`` (its own random init)."""
    model, _ = tiny_model(task, **options)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)  # weights no fresh init can equal
    cfg = complete_config(tiny_model_config(**options))
    task_cfg = OmegaConf.create({"_name": "electra", "data": "unused"})
    write_checkpoint(path, cfg, task_cfg, model.state_dict())
    return model


def fast(task, path, **options):
    return tiny_model(task, generator="fast_electra", generator_checkpoint=str(path),
                      **options)[0]


@pytest.mark.parametrize("source, encoder, head", [
    (dict(objective="mlm"), "discriminator", "mlm_head"),  # BERT's MLM: the network itself
    (dict(generator_size=0.5, generator_layers=0.5), "generator", "generator_head"),
])
def test_the_generator_is_the_checkpoints_masked_lm_frozen(source, encoder, head, tmp_path):
    task = make_task()
    mlm = saved_masked_lm(tmp_path / "mlm.pt", task, **source)
    model = fast(task, tmp_path / "mlm.pt")
    # its shape comes from the checkpoint, recorded in the config (a resume needs no file)
    expected = (0.5, 0.5) if "generator_size" in source else (1.0, 1.0)
    assert (model.cfg.generator_size, model.cfg.generator_layers) == expected
    assert not any(p.requires_grad for p in model.generator.parameters())
    assert not any(p.requires_grad for p in model.generator_head.parameters())
    model.set_num_updates(0)  # the first update loads the weights
    assert bool(model.generator_loaded)
    for ours, theirs in ((model.generator, getattr(mlm, encoder)),
                         (model.generator_head, getattr(mlm, head))):
        theirs = theirs.state_dict()
        assert all(torch.equal(v, theirs[k]) for k, v in ours.state_dict().items())
    # a step trains the discriminator only: no generator loss, no gradient reaches it
    loss, _, log = ElectraCriterion(task, 50.0)(model, sample_for(task))
    loss.backward()
    assert "gen_loss" not in log and "gen_correct" in log
    assert math.isclose(loss.item(), 50 * log["disc_loss"].item(), rel_tol=1e-6)
    assert all(p.grad is None for p in model.generator.parameters())
    assert model.discriminator.encoder.layer[0].output.dense.weight.grad.abs().sum() > 0


def test_temperature_decays_on_schedule_and_flops_count_a_forward(tmp_path):
    task = make_task()
    saved_masked_lm(tmp_path / "mlm.pt", task, objective="mlm")
    linear = fast(task, tmp_path / "mlm.pt", temperature_start=3.0, temperature=1.0,
                  temperature_decay_updates=4)
    cosine = fast(task, tmp_path / "mlm.pt", temperature_start=3.0, temperature=1.0,
                  temperature_decay_updates=4, temperature_schedule="cosine")
    seen = []
    for update in range(6):
        for model in (linear, cosine):
            model.set_num_updates(update)
        seen.append((linear.generator_kind.temperature(),
                     cosine.generator_kind.temperature()))
    assert [t for t, _ in seen] == [3.0, 2.5, 2.0, 1.5, 1.0, 1.0]
    assert [round(t, 6) for _, t in seen] == [
        3.0, round(2 + math.cos(math.pi / 4), 6), 2.0, round(2 - math.cos(math.pi / 4), 6),
        1.0, 1.0]
    log = ElectraCriterion(task, 50.0)(linear, sample_for(task))[2]
    assert log["gen_temperature"] == 1.0
    # FLOPs: the same network trained jointly costs its forward and backward, this its forward
    joint, _ = tiny_model(task, generator_size=1.0)
    trained, frozen = joint.train_flops(20, 3, 10), linear.train_flops(20, 3, 10)
    only_disc, _ = tiny_model(task, generator="unigram")
    assert trained - only_disc.train_flops(20, 3, 10) == \
        pytest.approx(2 * (frozen - only_disc.train_flops(20, 3, 10)))


def test_a_masked_lm_of_another_shape_or_vocabulary_is_one_line(tmp_path):
    task = make_task()
    saved_masked_lm(tmp_path / "wide.pt", task, objective="mlm", num_heads=2, hidden_size=128,
                    ffn_size=256)
    with pytest.raises(ElectraUsageError, match="not a generator of this discriminator's"):
        fast(task, tmp_path / "wide.pt")
    saved_masked_lm(tmp_path / "other_vocab.pt", make_task(vocab_size=80), objective="mlm")
    model = fast(task, tmp_path / "other_vocab.pt")
    with pytest.raises(ElectraUsageError, match="vocabulary of 80 entries"):
        model.set_num_updates(0)
    with pytest.raises(ElectraUsageError, match="does not exist"):
        fast(task, tmp_path / "missing.pt")


@pytest.mark.slow
def test_fairseq_train_logs_the_schedule_keeps_the_generator_and_resumes_exactly(
        data_bin, tmp_path):
    mlm = tmp_path / "mlm"
    proc = run_here(train_cmd(data_bin, mlm, "--objective", "mlm", "--max-update", "3",
                              "--disable-validation", "--no-epoch-checkpoints"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    options = ["--generator", "fast_electra", "--generator-checkpoint",
               mlm / "checkpoint_last.pt", "--temperature-start", "2",
               "--temperature-decay-updates", "4", "--disable-validation",
               "--no-epoch-checkpoints"]
    once = run_here(train_cmd(data_bin, tmp_path / "once", "--max-update", "4", *options))
    assert once.returncode == 0, once.stderr[-3000:]
    logs = records(once.stdout)
    assert [r["gen_temperature"] for r in logs] == [2.0, 1.75, 1.5, 1.25]
    assert all("gen_loss" not in r for r in logs)
    final = torch.load(tmp_path / "once" / "checkpoint_last.pt", weights_only=False)["model"]
    source = torch.load(mlm / "checkpoint_last.pt", weights_only=False)["model"]
    for key, value in final.items():  # frozen: the MLM's weights through 4 updates
        if key.startswith("generator."):
            assert torch.equal(value, source["discriminator." + key[len("generator."):]]), key
    # stopped after 2 updates and resumed: the same log lines and the same weights
    half = run_here(train_cmd(data_bin, tmp_path / "twice", "--max-update", "2", *options))
    assert half.returncode == 0, half.stderr[-3000:]
    rest = run_here(train_cmd(data_bin, tmp_path / "twice", "--max-update", "4", *options))
    assert rest.returncode == 0, rest.stderr[-3000:]
    resumed = records(half.stdout) + records(rest.stdout)
    keep = ("num_updates", "loss", "disc_loss", "gen_temperature", "disc_acc", "train_flops")
    assert [{k: r[k] for k in keep} for r in resumed] == [{k: r[k] for k in keep} for r in logs]
    again = torch.load(tmp_path / "twice" / "checkpoint_last.pt", weights_only=False)["model"]
    assert all(torch.equal(v, again[k]) for k, v in final.items())
