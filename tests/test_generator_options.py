"""Three options of the official pre-training code: ``--disallow-correct`` (a replacement is
never the original token), ``--generator uniform`` (replacements drawn uniformly) and
``--gen-weight`` (the generator loss's weight)."""

import math

import pytest
import torch
from scipy.stats import chi2

from electra_plugin.criterions.electra import ElectraCriterion
from electra_plugin.models.electra import ElectraModel
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import assert_one_line_error, records, run, run_here, sample_for, tiny_model, train_cmd

DETERMINISTIC = dict(dropout=0.0, attention_dropout=0.0)
ROWS = 20000


def peaked_log_probs(originals, vocab, mass=0.9):
    """Rows putting ``mass`` on the row's original, 3/4 of the rest on the next id and 1/4
    on the one after."""
    probs = torch.zeros(len(originals), vocab)
    rows = torch.arange(len(originals))
    probs[rows, originals] = mass
    probs[rows, (originals + 1) % vocab] = (1 - mass) * 0.75
    probs[rows, (originals + 2) % vocab] = (1 - mass) * 0.25
    return probs.log()


# ------------------------------------------------------------------------ --disallow-correct


def test_disallow_correct_never_samples_the_original_and_renormalises_the_rest():
    originals = torch.randint(0, 30, (ROWS,), generator=torch.Generator().manual_seed(0))
    log_probs = peaked_log_probs(originals, 30)
    torch.manual_seed(1)
    free = ElectraModel.sample(log_probs, 1.0)
    assert 0.88 < (free == originals).float().mean() < 0.92  # the option matters
    torch.manual_seed(1)
    drawn = ElectraModel.sample(log_probs, 1.0, originals)
    assert not (drawn == originals).any()
    # the other two keep their 3:1 ratio: 0.75 and 0.25 once the original's 0.9 is gone
    next_share = (drawn == (originals + 1) % 30).float().mean().item()
    assert (drawn == (originals + 2) % 30).float().mean().item() == pytest.approx(
        1 - next_share)
    assert abs(next_share - 0.75) < 5 * math.sqrt(0.75 * 0.25 / ROWS)
    # at any temperature, the argmax (0) included
    for temperature in (0.0, 0.5, 2.0):
        assert not (ElectraModel.sample(log_probs, temperature, originals) == originals).any()
    assert torch.equal(ElectraModel.sample(log_probs, 0.0, originals), (originals + 1) % 30)


def test_disallow_correct_replaces_every_masked_position_of_a_real_step():
    """The unigram generator over the test dictionary's 55 equal counts draws the original
    at about 1 in 55 of the 20 batches' 360 masked positions by default, never with the
    option."""
    def steps(**options):
        model, task = tiny_model(generator="unigram", **DETERMINISTIC, **options)
        outs = []
        for seed in range(20):
            sample = sample_for(task, seed=seed)
            torch.manual_seed(seed)
            outs.append(model(**sample["net_input"], target=sample["target"]))
        return outs

    default, disallowed = steps(), steps(disallow_correct=True)
    assert sum(int(out.logs["sampled_correct"]) for out in default) > 0
    for out in disallowed:
        assert int(out.logs["sampled_correct"]) == 0
        assert out.replaced.flatten()[out.positions].all()
        assert int(out.replaced.sum()) == len(out.positions)


def test_disallow_correct_keeps_the_generator_loss():
    losses = []
    for options in ({}, dict(disallow_correct=True)):
        model, task = tiny_model(**DETERMINISTIC, **options)
        torch.manual_seed(3)
        _, _, log = ElectraCriterion(task, 50.0)(model, sample_for(task))
        losses.append(log)
    assert torch.equal(losses[0]["gen_loss"], losses[1]["gen_loss"])
    assert int(losses[1]["sampled_correct"]) == 0


@pytest.mark.parametrize("generator", ["masked_lm", "adversarial", "tied", "unigram",
                                       "two_stage", "fast_electra", "uniform"])
def test_every_kind_accepts_disallow_correct(generator):
    """Every kind samples. fast_electra checks the options before asking for its
    checkpoint, so it gets past them here."""
    if generator == "fast_electra":
        with pytest.raises(ElectraUsageError, match="give it with --generator-checkpoint"):
            tiny_model(generator=generator, disallow_correct=True)
        return
    options = dict(two_stage_updates=1) if generator == "two_stage" else {}
    model, _ = tiny_model(generator=generator, disallow_correct=True, **options)
    assert model.generator_kind.name == generator


def test_mlm_has_no_generator_to_disallow_with():
    with pytest.raises(ElectraUsageError) as error:
        tiny_model(objective="mlm", disallow_correct=True)
    assert "--objective mlm has no generator, so --disallow-correct does not apply" in \
        str(error.value)


# ------------------------------------------------------------------------ --generator uniform


def test_uniform_generator_draws_every_ordinary_token_equally_and_no_special():
    model, task = tiny_model(generator="uniform")
    d = task.dictionary
    excluded = list(range(d.nspecial)) + [task.mask_idx]  # what unigram leaves out too
    candidates = [i for i in range(len(d)) if i not in excluded]
    assert model.generator is None and model.generator_head is None
    assert model.generator_kind.size() is None  # no FLOPs: as unigram's, the discriminator's
    assert model.train_flops(32, 8, 40) == tiny_model(generator="unigram")[0].train_flops(32, 8, 40)
    positions = torch.arange(len(candidates) * 2000)
    log_probs, baseline = model.generator_kind.propose(model, torch.zeros(1, 1).long(), None,
                                                       positions)
    assert baseline is None and log_probs.dtype == torch.float32
    assert log_probs.shape == (len(positions), len(d))
    assert log_probs[0].exp().sum().item() == pytest.approx(1.0)
    torch.manual_seed(0)
    counts = torch.bincount(model.sample(log_probs, 1.0), minlength=len(d)).double()
    assert counts[excluded].sum() == 0
    expected = len(positions) / len(candidates)
    observed = counts[candidates]
    statistic = ((observed - expected) ** 2 / expected).sum().item()
    assert chi2.sf(statistic, len(candidates) - 1) > 1e-4, statistic
    sigma = math.sqrt(expected * (1 - 1 / len(candidates)))
    assert (observed - expected).abs().max() < 5 * sigma


def test_uniform_generator_in_a_step_has_no_loss_and_replaces_with_ordinary_tokens():
    model, task = tiny_model(generator="uniform", **DETERMINISTIC)
    sample = sample_for(task)
    torch.manual_seed(0)
    loss, _, log = ElectraCriterion(task, 50.0, gen_weight=0.5)(model, sample)
    assert "gen_loss" not in log and "gen_correct" not in log
    assert torch.equal(loss, 50.0 * log["disc_loss"])
    torch.manual_seed(0)
    out = model(**sample["net_input"], target=sample["target"])
    sampled = out.corrupted.flatten()[out.positions]
    assert (sampled >= task.dictionary.nspecial).all() and (sampled != task.mask_idx).all()


# ------------------------------------------------------------------------ --gen-weight


@pytest.mark.parametrize("gen_weight", [1.0, 0.3, 2.5])
def test_gen_weight_scales_the_generator_loss(gen_weight):
    model, task = tiny_model(**DETERMINISTIC)
    sample = sample_for(task)
    torch.manual_seed(4)
    loss, _, log = ElectraCriterion(task, 50.0, gen_weight=gen_weight)(model, sample)
    expected = gen_weight * log["gen_loss"].item() + 50.0 * log["disc_loss"].item()
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    torch.manual_seed(4)
    out = model(**sample["net_input"], target=sample["target"])
    if gen_weight == 1.0:  # the default is the unweighted sum, bit for bit
        assert torch.equal(loss, 50.0 * out.main_loss + out.generator_loss)


# ------------------------------------------------------------------------ fairseq-train


@pytest.mark.slow
def test_the_three_options_train_with_fairseq_train(data_bin, tmp_path):
    result = run_here(train_cmd(data_bin, tmp_path, "--generator", "uniform", "--disallow-correct",
                                "--gen-weight", "0.5", "--max-update", "2", "--no-save",
                                "--disable-validation"))
    assert result.returncode == 0, result.stderr[-3000:]
    logs = records(result.stdout)
    assert [r["num_updates"] for r in logs] == [1, 2]
    for r in logs:
        assert math.isfinite(r["disc_loss"]) and "gen_loss" not in r
        assert r["sampled_acc"] == 0 and r["replaced_frac"] == 100  # every one replaced
    proc = run(train_cmd(data_bin, tmp_path, "--objective", "mlm", "--disallow-correct",
                         "--max-update", "1", "--no-save", "--disable-validation"))
    assert_one_line_error(proc, "--objective mlm has no generator", "--disallow-correct")
