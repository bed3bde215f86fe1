"""The RTD loss and its logged metrics on hand-checked batches."""

import math

import pytest
import torch
from fairseq import metrics

from electra_plugin.criterions.electra import ElectraCriterion
from helpers import binarize, failure, records, run, sample_for, tiny_model, train_cmd


def test_loss_is_mean_mlm_plus_lambda_mean_bce():
    model, task = tiny_model(dropout=0.0, attention_dropout=0.0)
    criterion = ElectraCriterion(task, disc_weight=50.0)
    sample = sample_for(task)
    torch.manual_seed(5)
    loss, sample_size, log = criterion(model, sample)
    torch.manual_seed(5)  # the same uniform draws for the inverse-CDF sampling
    out = model(**sample["net_input"], target=sample["target"])

    # by hand: -log softmax at the original token, averaged over the masked positions
    logits, targets = out.generator_log_probs.double(), out.masked_targets
    nll = [math.log(sum(math.exp(v) for v in row.tolist())) - row[t].item()
           for row, t in zip(logits, targets)]
    mlm = sum(nll) / len(nll)
    # binary cross-entropy over the non-pad tokens, label 1 = replaced
    bce = []
    for z, y, pad in zip(out.main.flatten().tolist(),
                         out.replaced.flatten().tolist(), out.padding_mask.flatten().tolist()):
        if not pad:
            p = 1 / (1 + math.exp(-z))
            bce.append(-math.log(p) if y else -math.log(1 - p))
    disc = sum(bce) / len(bce)

    assert sample_size == 1
    assert math.isclose(log["gen_loss"].item(), mlm, rel_tol=1e-5)
    assert math.isclose(log["disc_loss"].item(), disc, rel_tol=1e-5)
    assert math.isclose(loss.item(), mlm + 50 * disc, rel_tol=1e-5)
    assert log["tokens"] == len(bce) and log["masked"] == len(nll)
    assert log["replaced"] == int(out.replaced.sum())


def test_disc_weight_option():
    model, task = tiny_model(dropout=0.0, attention_dropout=0.0)
    sample = sample_for(task)
    torch.manual_seed(5)
    _, _, log = ElectraCriterion(task, disc_weight=1.0)(model, sample)
    assert math.isclose(log["loss"].item(), (log["gen_loss"] + log["disc_loss"]).item(),
                        rel_tol=1e-6)


def test_metrics_reduce_over_batches_as_totals():
    logs = [
        dict(loss=10.0, gen_loss=4.0, disc_loss=0.12, sample_size=1, ntokens=50, nsentences=2,
             masked=10, tokens=50, replaced=8, predicted_replaced=4, true_replaced=3,
             gen_correct=2, disc_correct=45),
        dict(loss=20.0, gen_loss=6.0, disc_loss=0.28, sample_size=1, ntokens=150, nsentences=6,
             masked=30, tokens=150, replaced=12, predicted_replaced=16, true_replaced=9,
             gen_correct=18, disc_correct=130),
    ]
    with metrics.aggregate() as agg:
        ElectraCriterion.reduce_metrics(logs)
    got = agg.get_smoothed_values()
    assert got["loss"] == 15.0 and got["gen_loss"] == 5.0
    assert got["gen_acc"] == round(100 * 20 / 40, 2)
    assert got["disc_acc"] == round(100 * 175 / 200, 2)
    assert got["disc_precision"] == round(100 * 12 / 20, 2)
    assert got["disc_recall"] == round(100 * 12 / 20, 2)
    assert got["replaced_frac"] == round(100 * 20 / 40, 2)
    assert got["disc_baseline"] == round(100 - 100 * 20 / 200, 2)
    assert not any(k.startswith("_") for k in got)


@pytest.mark.parametrize("objective", ["electra", "mlm", "electra_15"])
def test_batch_without_maskable_tokens_has_finite_losses(objective):
    """``<s> </s>`` lines (blank lines under --sample-break-mode eos) pick no position:
    the generator's and the objective's means over zero positions are 0, not NaN."""
    model, task = tiny_model(dropout=0.0, attention_dropout=0.0, objective=objective)
    d = task.dictionary
    src = torch.tensor([[d.bos(), d.eos(), d.pad()], [d.bos(), d.eos(), d.pad()]])
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1)},
              "target": torch.full_like(src, d.pad()), "ntokens": 4, "nsentences": 2}
    loss, _, log = ElectraCriterion(task, disc_weight=50.0)(model, sample)
    assert log["masked"] == 0 and torch.isfinite(loss), log
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.slow
def test_eos_break_mode_with_blank_lines_and_truncation_trains(tmp_path):
    """One block per line: blank lines give ``<s> </s>`` batches (size-sorted batching groups
    them), long lines are cut to fit <s> + --tokens-per-sample - 1 tokens."""
    lines = ["", "", "the cat sees a dog in the park today and the dog sees the cat back ."] * 40
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(lines[:9]) + "\n")
    data = binarize(tmp_path, tmp_path / "bin")
    proc = run(train_cmd(data, tmp_path / "ck", "--sample-break-mode", "eos",
                         "--shorten-method", "truncate", "--tokens-per-sample", "8",
                         "--max-update", "12", "--no-save"))
    assert proc.returncode == 0, failure("fairseq-train", proc)
    logs = records(proc.stdout) + records(proc.stdout, "valid")
    assert len(logs) == 13
    losses = [r[k] for r in logs for k in r if k.endswith("loss")]
    assert len(losses) == 13 * 3 and all(map(math.isfinite, losses)), logs
    # the AUC is undefined (NaN) exactly for updates whose batches replaced nothing
    blank = [r for r in logs[:-1] if r["replaced_frac"] == 0]
    assert blank and all(math.isnan(r["disc_auc"]) for r in blank)
    assert all(math.isfinite(r["disc_auc"]) for r in logs[:-1] if r not in blank)
