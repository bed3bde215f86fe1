"""Electric (``--objective electric --generator two_tower``): the NCE loss by hand, the two
towers' causality, the cloze loss's tokens, FLOPs, refusals, and real fairseq-train runs
(finite losses, linear FLOPs, exact resume)."""

import dataclasses
import math

import pytest
import torch
from omegaconf import OmegaConf

from electra_plugin.criterions.electra import ElectraCriterion
from electra_plugin.models.core.contract import BatchLayout
from electra_plugin.models.core.flops import (paper_discriminator_output, paper_encoder_flops,
                                              paper_generator_output)
from electra_plugin.models.objectives import OBJECTIVES, PretrainingOutput
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import (assert_same_params, assert_usage_error, built_from_command_line, checkpoint,
                     failure, masked_batch, records, run_here, sample_for, tiny_model, train_cmd)

ELECTRIC = dict(objective="electric", generator="two_tower")
DETERMINISTIC = dict(dropout=0.0, attention_dropout=0.0)


def electric_model(**overrides):
    model, task = tiny_model(**ELECTRIC, **DETERMINISTIC, **overrides)
    return model.eval(), task


def hand_output(main, noise_log_probs, corrupted, positions, padding_mask, original=None):
    """A PretrainingOutput holding only what the Electric losses read."""
    return PretrainingOutput(
        generator_log_probs=None, baseline_logits=None, masked_targets=None,
        positions=positions, masked_weights=torch.ones(len(positions)), corrupted=corrupted,
        original=original, replaced=None, padding_mask=padding_mask, main=main, copy=None,
        noise_log_probs=noise_log_probs)


# ------------------------------------------------------------------------ the NCE loss


def test_nce_loss_is_the_equation_by_hand():
    """Noise posterior k q / (k q + (n - k) exp(-E)) at the corrupted token, label 1 at the
    picked positions (one of them sampled its original back), mean over non-pad tokens."""
    energy = torch.tensor([[0.5, -1.0, 2.0, 0.0], [1.5, 0.3, -0.7, 9.0]])
    table = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1], [0.25] * 4,
                           [0.4, 0.3, 0.2, 0.1]],
                          [[0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.3, 0.3, 0.3, 0.1],
                           [0.25] * 4]])
    corrupted = torch.tensor([[0, 2, 1, 3], [0, 1, 3, 1]])
    padding = torch.tensor([[False] * 4, [False, False, False, True]])
    picked = {(0, 1), (0, 2), (1, 1)}  # (0, 2): the sample is the original, still noise
    positions = torch.tensor([4 * b + t for b, t in sorted(picked)])
    k_over_n_minus_k = 0.2 / 0.8  # --mask-prob 0.2
    main = energy + math.log(k_over_n_minus_k)  # what predict gives (test below)
    out = hand_output(main, table.log(), corrupted, positions, padding)

    loss, per_token, counts = OBJECTIVES["electric"].main_loss(out)

    terms, correct = [], 0
    for b in range(2):
        for t in range(4):
            if padding[b, t]:
                continue
            noise = k_over_n_minus_k * table[b, t, corrupted[b, t]].item()
            data = math.exp(-energy[b, t].item())
            p_noise = noise / (noise + data)
            terms.append(-math.log(p_noise if (b, t) in picked else 1 - p_noise))
            correct += (p_noise > 0.5) == ((b, t) in picked)
    assert loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-6)
    assert counts["tokens"] == 7 and counts["disc_correct"] == correct
    assert per_token.shape == (2, 4)


def test_predict_adds_the_runs_prior_log_odds_to_the_raw_energy():
    model, _ = electric_model()
    hidden = torch.randn(2, 5, 64)
    main, copy = OBJECTIVES["electric"].predict(model, hidden, None)
    raw = model.discriminator_head(hidden)
    assert copy is None
    assert torch.allclose(main, raw + math.log(0.15 / 0.85))  # the task's default
    model.generator_kind.complete_run(OmegaConf.create({"task": {"mask_prob": 0.2}}))
    assert torch.allclose(OBJECTIVES["electric"].predict(model, hidden, None)[0],
                          raw + math.log(0.25))


def test_the_step_reads_q_at_the_corrupted_token_without_gradient():
    model, task = electric_model()
    sample = sample_for(task)
    torch.manual_seed(3)
    out = model(**sample["net_input"], target=sample["target"])
    # the sampling distribution is q at the picked positions
    assert torch.equal(out.generator_log_probs,
                       out.noise_log_probs.flatten(0, 1)[out.positions])
    log_q = out.noise_log_probs.gather(-1, out.corrupted[..., None]).squeeze(-1)
    logits = out.main + log_q
    covered = ~out.padding_mask
    noise = torch.zeros_like(covered).flatten().index_fill_(0, out.positions, True)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(
        logits.flatten(), noise.float(), reduction="none")
    assert out.main_loss.item() == pytest.approx(bce[covered.flatten()].mean().item(),
                                                 rel=1e-6)
    # no gradient reaches the generator through log q: the NCE loss moves only the
    # discriminator (and the shared embeddings through its input)
    model.zero_grad()
    out.main_loss.backward()
    assert model.cloze_head.dense.weight.grad is None or \
        not model.cloze_head.dense.weight.grad.any()
    assert all(p.grad is None or not p.grad.any()
               for p in model.generator_ltr.encoder.parameters())


def test_the_default_path_has_no_noise_log_probs():
    model, task = tiny_model(**DETERMINISTIC)
    sample = sample_for(task)
    assert model(**sample["net_input"], target=sample["target"]).noise_log_probs is None


# ------------------------------------------------------------------------ the two towers


def cloze(model, tokens):
    """(B x T x V log q, B x T x 2H the head's input) of the original ``tokens``."""
    seen = []
    handle = model.cloze_head.register_forward_hook(lambda m, args, o: seen.append(args[0]))
    layout = BatchLayout(tokens.eq(model.padding_idx))
    with torch.no_grad():
        log_q, baseline = model.generator_kind.propose(model, tokens, layout, None)
    handle.remove()
    assert baseline is None
    return log_q, seen[0]


@pytest.mark.parametrize("padded", [False, True])
def test_q_at_t_never_reads_x_t_and_each_tower_reads_one_side(padded):
    """Changing x_t changes the left tower's half of the features from t + 1 on and the
    right tower's up to t - 1, never position t: q_t does not depend on x_t (in a padded
    row too, whose last token's right side is a padding state)."""
    model, task = electric_model()
    tokens = masked_batch(task, rows=2, length=10, seed=4)[2]  # row 1 ends in padding
    if not padded:
        tokens = tokens[:1]
    log_q, hidden = cloze(model, tokens)
    assert torch.isfinite(log_q).all()
    half = hidden.size(-1) // 2
    for row in range(len(tokens)):
        real = int(tokens[row].ne(model.padding_idx).sum())
        for t in range(real):
            changed = tokens.clone()
            changed[row, t] = 5 if tokens[row, t] != 5 else 6
            log_q2, hidden2 = cloze(model, changed)
            assert torch.equal(log_q2[row, t], log_q[row, t]), (row, t)
            for s in range(real):
                left, right = (not torch.equal(hidden2[row, s, part], hidden[row, s, part])
                               for part in (slice(None, half), slice(half, None)))
                assert (left, right) == (s > t, s < t), (row, t, s, left, right)
                if s != t:
                    assert not torch.allclose(log_q2[row, s], log_q[row, s], rtol=0,
                                              atol=1e-7)
            others = [r for r in range(len(tokens)) if r != row]
            assert torch.equal(log_q2[others], log_q[others])  # rows are their own


def test_the_towers_read_the_original_tokens_not_the_masked_input():
    model, task = electric_model()
    src, target, tokens, _ = masked_batch(task)
    torch.manual_seed(0)
    masked = model(src, target=target)
    torch.manual_seed(0)
    kept = model(tokens, target=target)  # every picked token left unchanged in the input
    assert torch.equal(masked.noise_log_probs, kept.noise_log_probs)


# ------------------------------------------------------------------------ the cloze loss


def test_cloze_loss_covers_every_ordinary_token_and_nothing_else():
    model, task = electric_model()
    d = task.dictionary
    original = torch.tensor([[d.bos(), 7, d.unk(), 9, task.mask_idx, 11, d.eos(), d.pad()]])
    table = torch.randn(1, 8, len(d)).log_softmax(-1).requires_grad_()
    out = hand_output(None, table, original, torch.tensor([1]), original.eq(d.pad()),
                      original=original)
    loss = model.generator_kind.trained_loss(out, None)
    ordinary = [1, 2, 3, 5]  # <unk> is ordinary, as the official [UNK]; <mask> is not
    expected = -sum(table[0, t, original[0, t]].item() for t in ordinary) / len(ordinary)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert table.grad[0].ne(0).nonzero().tolist() == [[t, original[0, t].item()]
                                                      for t in ordinary]


def test_the_step_logs_the_cloze_loss_weighted_by_gen_weight():
    model, task = electric_model()
    sample = sample_for(task)
    torch.manual_seed(1)
    loss, _, log = ElectraCriterion(task, disc_weight=50.0, gen_weight=0.5)(model, sample)
    torch.manual_seed(1)
    out = model(**sample["net_input"], target=sample["target"])
    d = task.dictionary
    ordinary = ~torch.isin(out.original, torch.tensor([d.bos(), d.eos(), d.pad(),
                                                       task.mask_idx]))
    log_q = out.noise_log_probs.gather(-1, out.original[..., None]).squeeze(-1)
    assert log["gen_loss"].item() == pytest.approx(-log_q[ordinary].mean().item(), rel=1e-6)
    assert loss.item() == pytest.approx(0.5 * log["gen_loss"].item()
                                        + 50 * log["disc_loss"].item(), rel=1e-6)
    assert log["masked"] == len(out.positions) and "gen_correct" in log


# ------------------------------------------------------------------------ FLOPs


def test_flops_count_both_towers_and_the_cloze_head_at_every_position():
    model, _ = electric_model()
    disc, tower = model._disc_size, model.generator_kind.size()
    assert (tower.hidden, tower.layers, tower.heads) == (16, 2, 1)
    vocab, length, rows = model.vocab_size, 32, 8
    positions = length * rows
    head = dataclasses.replace(tower, hidden=2 * tower.hidden)
    expected = 2 * (paper_encoder_flops(disc, vocab, length, positions)
                    + positions * paper_discriminator_output(disc)) \
        + 2 * (2 * paper_encoder_flops(tower, vocab, length, positions)
               + positions * paper_generator_output(head, vocab))
    assert model.train_flops(length, rows, 40) == expected
    assert model.train_flops(length, rows, 1) == expected  # whatever the masked count


# ------------------------------------------------------------------------ refusals


@pytest.mark.parametrize("options, phrase", [
    (dict(objective="electric"), "use --generator two_tower, not masked_lm"),
    (dict(objective="electric", generator="unigram"), "use --generator two_tower, not unigram"),
    (dict(generator="two_tower"), "--generator two_tower is defined for --objective electric, "
                                  "not electra"),
    (dict(generator="two_tower", objective="electra_15"), "not electra_15"),
    (dict(**ELECTRIC, embedding_sharing="untied"), "works with --embedding-sharing shared"),
])
def test_other_pairings_are_one_line_errors(options, phrase):
    with pytest.raises(ElectraUsageError) as error:
        tiny_model(**options)
    line = str(error.value)
    assert phrase in line and "\n" not in line, line


# ------------------------------------------------------------------------ fairseq-train

ELECTRIC_FLAGS = ("--objective", "electric", "--generator", "two_tower")


@pytest.mark.slow
def test_the_runs_mask_prob_is_the_prior(data_bin, tmp_path):
    _, _, model = built_from_command_line(data_bin, *ELECTRIC_FLAGS, "--mask-prob", "0.2")
    assert model.generator_kind.noise_log_odds == pytest.approx(math.log(0.25))
    assert_usage_error(train_cmd(data_bin, tmp_path, "--objective", "electric"),
                       "--objective electric", "--generator two_tower")


@pytest.mark.slow
def test_electric_trains_with_fairseq_train(data_bin, tmp_path):
    result = run_here(train_cmd(data_bin, tmp_path, "--max-update", "3", "--no-save",
                                "--disable-validation", *ELECTRIC_FLAGS))
    assert result.returncode == 0, failure("fairseq-train", result)
    logs = records(result.stdout)
    assert [r["num_updates"] for r in logs] == [1, 2, 3]
    assert all(math.isfinite(r[key]) for r in logs for key in ("loss", "disc_loss", "gen_loss"))
    assert all(0 <= r["disc_acc"] <= 100 and 0 <= r["noise_recall"] <= 100 for r in logs)
    flops = [r["train_flops"] for r in logs]
    # the same every update (the towers run at every position, whatever is masked); the
    # log rounds to 4 digits
    assert flops[0] > 0 and flops == pytest.approx([flops[0], 2 * flops[0], 3 * flops[0]],
                                                   rel=1e-4)


@pytest.mark.slow
def test_stop_and_resume_gives_the_same_losses_and_model(data_bin, tmp_path):
    """4 updates in one go == 2 updates, stop, restart to 4 (dropout and sampling on)."""
    once, twice = tmp_path / "once", tmp_path / "twice"
    flags = ("--disable-validation", *ELECTRIC_FLAGS)
    straight = run_here(train_cmd(data_bin, once, "--max-update", "4", *flags))
    assert straight.returncode == 0, failure("fairseq-train", straight)
    first = run_here(train_cmd(data_bin, twice, "--max-update", "2", *flags))
    assert first.returncode == 0, failure("fairseq-train", first)
    resumed = run_here(train_cmd(data_bin, twice, "--max-update", "4", *flags))
    assert resumed.returncode == 0, failure("fairseq-train", resumed)
    assert "Loaded checkpoint" in resumed.stdout + resumed.stderr

    keys = ("loss", "disc_loss", "gen_loss", "disc_acc", "gen_acc", "train_flops")
    one = [{k: r[k] for k in ("num_updates",) + keys} for r in records(straight.stdout)]
    two = [{k: r[k] for k in ("num_updates",) + keys}
           for r in records(first.stdout) + records(resumed.stdout)]
    assert [r["num_updates"] for r in two] == [1, 2, 3, 4]
    assert one == two
    a, b = (checkpoint(d / "checkpoint_last.pt")["model"] for d in (once, twice))
    assert_same_params(a, b, atol=0.0, what="resumed vs uninterrupted")
