"""The official pre-training metrics: disc_auc against scikit-learn on real batches,
sampled_acc, and the metrics in TensorBoard's event files."""

import copy
import math
import struct
import sys

import numpy as np

import pytest
import torch
from fairseq import checkpoint_utils, metrics
from omegaconf import OmegaConf
from sklearn.metrics import roc_auc_score

from electra_plugin.criterions.electra import ElectraCriterion, feature_spread
from electra_plugin.metrics.auc import auc_from_counts, auc_pair_counts
from electra_plugin.models.electra import ElectraModel
from electra_plugin.tasks.electra_pretraining import (
    ElectraPretrainingConfig,
    ElectraPretrainingTask,
)
from helpers import PLUGIN, failure, import_plugin, records, run, run_here, train_cmd


@pytest.fixture(scope="module")
def trained(data_bin, tmp_path_factory):
    """Checkpoints of a tiny run at update 1 (scores still bunched) and update 120."""
    save = tmp_path_factory.mktemp("auc_run")
    proc = run_here(train_cmd(data_bin, save, "--max-update", "120", "--lr", "2e-3",
                              "--save-interval-updates", "1", "--keep-interval-updates", "120",
                              "--no-epoch-checkpoints", "--disable-validation", "--log-interval",
                              "20"))
    assert proc.returncode == 0, failure("fairseq-train", proc)
    return save


def real_batches(checkpoint, data_bin, count=6):
    """(model, task, criterion, batches) of the valid split, as fairseq-train builds them."""
    import_plugin()
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data_bin)})
    model = models[0].eval()
    task.load_dataset("valid")
    itr = task.get_batch_iterator(task.dataset("valid"), max_sentences=8, seed=1)
    batches = [b for _, b in zip(range(count), itr.next_epoch_itr(shuffle=False))]
    return model, task, ElectraCriterion(task, 50.0), batches


@pytest.mark.slow
@pytest.mark.parametrize("update", [1, 120])
def test_disc_auc_matches_scikit_learn_on_real_batches(trained, data_bin, update):
    """Exact per batch; over several batches, the pair-weighted mean of the batches' AUCs."""
    (path,) = trained.glob(f"checkpoint_*_{update}.pt")
    model, _, criterion, batches = real_batches(path, data_bin)
    logs, aucs, pairs, scores, labels = [], [], [], [], []
    with torch.no_grad():
        for i, batch in enumerate(batches):
            torch.manual_seed(i)
            _, _, log = criterion(model, batch)
            logs.append(log)
            torch.manual_seed(i)  # the same samples again, for the raw scores
            out = model(**batch["net_input"], target=batch["target"])
            real = ~out.padding_mask
            score, label = out.main[real].double().numpy(), out.replaced[real].numpy()
            aucs.append(roc_auc_score(label, score))
            pairs.append(label.sum() * (~label).sum())
            assert auc_from_counts(log["disc_auc_pairs"]) == pytest.approx(aucs[-1], abs=1e-12)
            scores.append(score)
            labels.append(label)
    with metrics.aggregate() as agg:
        ElectraCriterion.reduce_metrics(logs)
    logged = agg.get_smoothed_values()["disc_auc"]
    expected = sum(a * p for a, p in zip(aucs, pairs)) / sum(pairs)
    assert abs(logged - expected) <= 5e-5, (logged, expected)  # rounded to 4 decimals
    # cross-batch pairs change little: the AUC of all tokens pooled is close
    pooled = roc_auc_score(np.concatenate(labels), np.concatenate(scores))
    assert abs(logged - pooled) < 0.02, (logged, pooled)
    if update == 120:  # trained scores still bunch tightly, where binned AUCs would tie
        # (whether the discriminator ranks better than chance is test_training's question:
        # these ~90 replaced tokens give a chance AUC a standard error of ~0.03)
        assert np.concatenate(scores).std() < 0.05


def test_auc_counts_on_synthetic_scores():
    """Ranks, ties (bf16), padding and an empty class, against scikit-learn."""
    g = torch.Generator().manual_seed(0)
    for scale, shift in ((1e-3, 0.0), (0.003, -2.0), (3.0, -2.0), (30.0, 5.0)):
        labels = torch.rand(4000, generator=g) < 0.15
        scores = (torch.randn(4000, generator=g) + 0.4 * labels) * scale + shift
        covered = torch.rand(4000, generator=g) < 0.9
        for dtype in (torch.float32, torch.bfloat16):  # bf16: many tied scores
            got = auc_from_counts(auc_pair_counts(scores.to(dtype), labels, covered))
            want = roc_auc_score(labels[covered].numpy(),
                                 scores.to(dtype)[covered].double().numpy())
            assert got == pytest.approx(want, abs=1e-12), (scale, shift, dtype)
    tied = torch.zeros(10)
    assert auc_from_counts(auc_pair_counts(tied, torch.arange(10) < 3, tied == 0)) == 0.5
    nothing_replaced = auc_pair_counts(torch.randn(10), torch.zeros(10, dtype=torch.bool),
                                       torch.ones(10, dtype=torch.bool))
    assert math.isnan(auc_from_counts(nothing_replaced))


@pytest.mark.slow
def test_sampled_acc_counts_samples_equal_to_the_original(trained, data_bin):
    model, _, criterion, batches = real_batches(trained / "checkpoint_last.pt", data_bin, 2)
    for batch in batches:
        torch.manual_seed(0)
        _, _, log = criterion(model, batch)
        torch.manual_seed(0)
        out = model(**batch["net_input"], target=batch["target"])
        sampled = out.corrupted.flatten()[out.positions]
        assert log["sampled_correct"] == (sampled == out.masked_targets).sum()
        # a sample differs from the original exactly where the token counts as replaced
        assert log["sampled_correct"] + log["replaced"] == log["masked"]


def read_events(directory):
    """{tag: [values]} of every scalar in the tfevents files under ``directory``."""
    from tensorboardX.proto import event_pb2

    values = {}
    for path in directory.rglob("events.out.tfevents.*"):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):  # TFRecord: length, its crc, the record, its crc
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 16 + length
            for value in event.summary.value:
                values.setdefault(f"{path.parent.name}/{value.tag}", []).append(
                    value.simple_value)
    return values


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_metrics(data_bin, tmp_path):
    pytest.importorskip("tensorboardX")
    proc = run(train_cmd(data_bin, tmp_path / "save", "--max-update", "4", "--log-interval", "2",
                         "--no-save", "--tensorboard-logdir", tmp_path / "tb"))
    assert proc.returncode == 0, failure("fairseq-train", proc)
    events = read_events(tmp_path / "tb")
    for subset in ("train_inner", "valid"):
        for key in ("disc_auc", "sampled_acc", "gen_acc", "disc_loss", "gen_loss"):
            assert events.get(f"{subset}/{key}"), f"{subset}/{key} not in {sorted(events)}"
    logged = [r["disc_auc"] for r in records(proc.stdout)]
    assert events["train_inner/disc_auc"] == pytest.approx(logged, abs=1e-4)


# --------------------------------------------------------------------------- feature spread
@pytest.fixture(scope="module")
def fresh(data_bin):
    """(random-init tiny model in eval mode, criterion, the valid split's task)."""
    task = ElectraPretrainingTask.setup_task(
        ElectraPretrainingConfig(data=str(data_bin), tokens_per_sample=32, seed=1))
    task.load_dataset("valid")
    torch.manual_seed(0)
    model = ElectraModel.build_model(OmegaConf.create(dict(
        _name="electra_tiny", num_layers=2, hidden_size=64, num_heads=4, ffn_size=128,
        embedding_size=32, temperature=0.0)), task).eval()  # argmax samples: no randomness
    return model, ElectraCriterion(task, 50.0), task


def valid_batches(task, size=8):
    itr = task.get_batch_iterator(task.dataset("valid"), max_sentences=size, seed=1)
    return list(itr.next_epoch_itr(shuffle=False))


def validate(model, criterion, batches):
    """(logged disc_feature_spread, logging outputs) of the batches, as validation logs."""
    with torch.no_grad():
        logs = [criterion(model, batch)[2] for batch in batches]
    with metrics.aggregate(new_root=True) as agg:
        ElectraCriterion.reduce_metrics(logs)
    return agg.get_smoothed_values()["disc_feature_spread"], logs


def test_feature_spread_is_that_of_the_pooled_features(fresh):
    model, criterion, task = fresh
    batches = valid_batches(task)
    pooled = []
    with torch.no_grad():
        for batch in batches:
            out = model(**batch["net_input"], target=batch["target"])
            # the discriminator alone (its padding from the input: a sample may be <pad>)
            features, _ = model.discriminator(out.corrupted, padding_mask=out.padding_mask)
            pooled += [row[~pad].double().mean(0).numpy()
                       for row, pad in zip(features, out.padding_mask)]
    pooled = np.stack(pooled)
    want = np.sqrt(pooled.var(0, ddof=1).mean()) / np.linalg.norm(pooled.mean(0))
    logged, logs = validate(model, criterion, batches)
    assert len(batches) > 2 and len(pooled) > 20
    assert abs(logged - want) <= 5e-5, (logged, want)  # rounded to 4 decimals
    assert spread_of(logs) == pytest.approx(want, rel=1e-6)
    # the sums are exact over batches: other batches of the same sequences, the same spread
    _, logs_of_3 = validate(model, criterion, valid_batches(task, 3))
    assert spread_of(logs_of_3) == pytest.approx(want, rel=1e-6)


def spread_of(logs):
    """The unrounded spread of the summed logging outputs."""
    return feature_spread(*(sum(log[key] for log in logs)
                            for key in ("feature_sum", "feature_sq_sum", "feature_seqs")))


def test_feature_spread_of_input_independent_features(fresh):
    model, criterion, task = fresh
    batches = valid_batches(task)
    healthy, _ = validate(model, criterion, batches)
    collapsed = copy.deepcopy(model)
    last = collapsed.discriminator.encoder.layer[-1].output
    with torch.no_grad():
        last.dense.weight.zero_()
        last.dense.bias.zero_()
        last.LayerNorm.weight.zero_()
        last.LayerNorm.bias.normal_()  # every token's features are this bias
    spread, _ = validate(collapsed, criterion, batches)
    assert spread < 1e-6 and healthy > 0.01, (spread, healthy)
    assert all("feature_seqs" not in criterion(model.train(), b)[2] for b in batches[:1])
    model.eval()


@pytest.mark.slow
def test_feature_spread_in_validation_logs_exact_over_batching(data_bin, tmp_path):
    """Logged at validation only; fairseq-validate logs the same for other batches of the
    same input (argmax samples, --temperature 0, fix the input; --required-batch-size-multiple
    1 keeps the last, partial batch, which fairseq drops otherwise: its issue 5036)."""
    whole = ("--required-batch-size-multiple", "1")
    proc = run_here(train_cmd(data_bin, tmp_path, "--max-update", "3", "--temperature", "0",
                              "--no-epoch-checkpoints", *whole))
    assert proc.returncode == 0, failure("fairseq-train", proc)
    train = records(proc.stdout) + records(proc.stdout, "train")
    (valid,) = records(proc.stdout, "valid")
    assert len(train) == 4 and not any("feature" in key for r in train for key in r), train
    assert 0 < valid["valid_disc_feature_spread"] < 1, valid
    proc = run([sys.executable, "-m", "fairseq_cli.validate", data_bin, "--user-dir", PLUGIN,
                "--task", "electra", "--path", tmp_path / "checkpoint_last.pt", "--cpu",
                "--batch-size", "3", *whole, "--num-workers", "0", "--log-format", "json",
                "--data-buffer-size", "0"])
    assert proc.returncode == 0, failure("fairseq-validate", proc)
    (by_3,) = records(proc.stdout, "valid")
    assert by_3["valid_gen_acc"] == valid["valid_gen_acc"]  # the same input
    assert by_3["valid_disc_feature_spread"] == valid["valid_disc_feature_spread"], by_3
