"""The paper's objectives and generator variants: each loss checked by hand on a small batch,
each option run through fairseq-train / fairseq-hydra-train, bad combinations as one line."""

import math
import shutil

import pytest
import torch
import torch.nn.functional as F
from fairseq import checkpoint_utils

from electra_plugin.criterions.electra import ElectraCriterion
from electra_plugin.models.core.config import EncoderSize
from electra_plugin.models.core.flops import paper_encoder_flops
from electra_plugin.models.objectives import OBJECTIVES
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import (
    assert_usage_error, hydra_train, import_plugin, make_task, records, run_here, sample_for,
    tiny_model, train_cmd,
)

DETERMINISTIC = dict(dropout=0.0, attention_dropout=0.0)


def step(objective, disc_weight=50.0, seed=5, **overrides):
    """(model, loss, log, out) of one batch; ``out`` recomputed with the same sampling noise."""
    model, task = tiny_model(objective=objective, **DETERMINISTIC, **overrides)
    sample = sample_for(task)
    torch.manual_seed(seed)
    loss, _, log = ElectraCriterion(task, disc_weight)(model, sample)
    torch.manual_seed(seed)
    out = model(**sample["net_input"], target=sample["target"])
    return model, loss, log, out


def model_task(model):
    return tiny_model()[1]  # make_task is deterministic: the task step() used


def mean_nll(log_probs, targets):
    """Cross-entropy from scratch: -log softmax at the target, averaged over rows."""
    rows = [math.log(sum(math.exp(v) for v in row.tolist())) - row[t].item()
            for row, t in zip(log_probs.double(), targets)]
    return sum(rows) / len(rows)


def bce(z, y):
    p = 1 / (1 + math.exp(-z))
    return -math.log(p) if y else -math.log(1 - p)


# ------------------------------------------------------------------------ objectives by hand


def test_electra_15_averages_the_binary_loss_over_masked_positions_only():
    _, loss, log, out = step("electra_15")
    picked = set(out.positions.tolist())
    flat = zip(out.main.flatten().tolist(), out.replaced.flatten().tolist())
    terms = [bce(z, y) for i, (z, y) in enumerate(flat) if i in picked]
    gen = mean_nll(out.generator_log_probs, out.masked_targets)
    assert math.isclose(log["disc_loss"].item(), sum(terms) / len(terms), rel_tol=1e-5)
    assert math.isclose(loss.item(), gen + 50 * sum(terms) / len(terms), rel_tol=1e-5)
    assert log["tokens"] == len(terms) == out.masked_targets.numel()


def test_mlm_is_bert_no_generator_and_masks_kept():
    model, loss, log, out = step("mlm")
    assert model.generator is None and model.generator_head is None
    assert model.discriminator_head is None and model.mlm_head is not None
    assert out.generator_log_probs is None
    assert torch.equal(out.corrupted, sample_for(model_task(model))["net_input"]["src_tokens"])
    # the MLM head is tied to the (discriminator's) token embeddings
    assert model.mlm_head.embed_tokens[0] is model.discriminator.embeddings.word_embeddings
    expected = mean_nll(out.main, out.masked_targets)
    assert math.isclose(loss.item(), expected, rel_tol=1e-5)
    assert math.isclose(log["mlm_loss"].item(), expected, rel_tol=1e-5)
    assert "gen_loss" not in log and "disc_loss" not in log


def test_replace_mlm_predicts_originals_from_generator_samples():
    model, loss, log, out = step("replace_mlm")
    task = model_task(model)
    src = sample_for(task)["net_input"]["src_tokens"]
    picked = torch.zeros(src.numel(), dtype=torch.bool).index_fill_(0, out.positions, True)
    assert torch.equal(out.corrupted.flatten()[~picked], src.flatten()[~picked])
    # the picked positions hold samples, (almost) never <mask>
    assert out.corrupted.flatten()[picked].ne(task.mask_idx).float().mean() > 0.5
    gen = mean_nll(out.generator_log_probs, out.masked_targets)
    main = mean_nll(out.main, out.masked_targets)
    # both MLM losses at weight 1, whatever --disc-weight says
    assert math.isclose(loss.item(), gen + main, rel_tol=1e-5)
    assert math.isclose(log["mlm_loss"].item(), main, rel_tol=1e-5)


def test_all_tokens_mlm_copy_mechanism_by_hand():
    _, loss, log, out = step("all_tokens_mlm")
    terms = []
    B, T, V = out.main.shape
    for b in range(B):
        for t in range(T):
            if out.padding_mask[b, t]:
                continue
            copy = 1 / (1 + math.exp(-out.copy[b, t].item()))
            row = out.main[b, t].double()
            softmax = (row - row.logsumexp(0)).exp()
            orig, seen = out.original[b, t].item(), out.corrupted[b, t].item()
            p = copy * (orig == seen) + (1 - copy) * softmax[orig].item()
            terms.append(-math.log(p))
    gen = mean_nll(out.generator_log_probs, out.masked_targets)
    assert math.isclose(log["mlm_loss"].item(), sum(terms) / len(terms), rel_tol=1e-5)
    assert math.isclose(loss.item(), gen + sum(terms) / len(terms), rel_tol=1e-5)
    assert log["mlm_tokens"] == len(terms)


# ------------------------------------------------------------------------ generator variants


@pytest.mark.slow
def test_tied_generator_is_the_discriminator():
    model, _ = tiny_model(generator="tied")
    assert model.generator is model.discriminator
    untied, _ = tiny_model(generator_size=1.0)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(untied) - count(model) == sum(p.numel() for n, p in
                                               untied.generator.named_parameters()
                                               if not n.startswith("embeddings."))
    sample = sample_for(tiny_model()[1])
    loss, _, _ = ElectraCriterion(tiny_model()[1], 50.0)(model, sample)
    loss.backward()
    # the shared encoder learns from both losses
    layer = model.discriminator.encoder.layer[0].attention.self.query.weight
    assert layer.grad is not None and layer.grad.abs().sum() > 0


def test_unigram_generator_samples_the_dictionary_counts():
    model, task = tiny_model(generator="unigram")
    d = task.dictionary
    assert model.generator is None and model.generator_head is None
    counts = torch.tensor(d.count, dtype=torch.float)
    counts[:d.nspecial] = 0
    counts[task.mask_idx] = 0
    expected = counts / counts.sum()
    torch.manual_seed(0)
    draws = model.sample(model.unigram.log_probs.expand(40000, -1), 1.0)
    seen = torch.bincount(draws, minlength=len(d)).float() / len(draws)
    assert seen[:d.nspecial].sum() == 0 and seen[task.mask_idx] == 0
    assert torch.allclose(seen, expected, atol=4 * math.sqrt(expected.max() / 40000))
    _, loss, log, out = step("electra", generator="unigram")
    # the replacements are drawn from the unigram table at every masked position
    assert torch.equal(out.generator_log_probs,
                       model.unigram.log_probs.expand(out.masked_targets.numel(), -1))
    assert "gen_loss" not in log and "gen_correct" not in log
    assert math.isclose(loss.item(), 50 * log["disc_loss"].item(), rel_tol=1e-6)


def skewed_task():
    """A dictionary whose counts are far from uniform, as dict.txt's are."""

    task = make_task()
    for i in range(task.dictionary.nspecial, len(task.dictionary) - 1):
        task.dictionary.count[i] = 1000 // (i - 3)
    return task


def test_unigram_follows_skewed_counts():
    model, task = tiny_model(skewed_task(), generator="unigram")
    torch.manual_seed(1)
    draws = model.sample(model.unigram.log_probs.expand(20000, -1), 1.0)
    top = torch.bincount(draws, minlength=len(task.dictionary)).argmax().item()
    assert top == task.dictionary.nspecial  # the most frequent ordinary token


def test_adversarial_generator_reinforce_with_learned_baseline_by_hand():
    model, loss, log, out = step("electra", generator="adversarial")
    M = out.masked_targets.numel()
    per_token = F.binary_cross_entropy_with_logits(out.main.double(), out.replaced.double(),
                                                   reduction="none").flatten()
    sampled = out.corrupted.flatten()[out.positions]
    policy = fit = 0.0
    for i in range(M):
        r = per_token[out.positions[i]].item()
        z = out.baseline_logits[i].item()
        b = -math.log(1 / (1 + math.exp(-z)))
        log_p = out.generator_log_probs[i, sampled[i]].item()
        policy += -(r - b) * log_p / M
        fit += bce(z, 1) * math.exp(-r) / M + bce(z, 0) * (1 - math.exp(-r)) / M
    assert math.isclose(log["gen_loss"].item(), policy + fit, rel_tol=1e-4)
    assert math.isclose(loss.item(), policy + fit + 50 * log["disc_loss"].item(), rel_tol=1e-5)
    # the baseline learns only from its own loss: its input is detached from the generator
    model.zero_grad()
    out.baseline_logits.sum().backward()
    assert model.generator_baseline.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.generator.parameters())


@pytest.mark.slow
def test_two_stage_switch_copies_the_generator_and_freezes_it():
    model, task = tiny_model(generator="two_stage", two_stage_updates=3)
    criterion = ElectraCriterion(task, 50.0)
    sample = sample_for(task)
    model.set_num_updates(2)
    loss, _, log = criterion(model, sample)
    assert "disc_loss" not in log and log["loss"] == log["gen_loss"]  # generator alone
    loss.backward()
    assert all(p.grad is None for p in model.discriminator.parameters())
    first = model.train_flops(20, 3, log["masked"])

    model.zero_grad()
    model.set_num_updates(3)
    assert bool(model.second_stage)
    gen, disc = model.generator.state_dict(), model.discriminator.state_dict()
    assert all(torch.equal(gen[k], disc[k]) for k in gen)
    loss, _, log = criterion(model, sample)
    assert math.isclose(loss.item(), 50 * log["disc_loss"].item(), rel_tol=1e-6)
    loss.backward()
    assert all(p.grad is None for p in model.generator.parameters())
    assert all(p.grad is None for p in model.generator_head.parameters())
    # stage 1: generator forward + backward; stage 2: discriminator fwd+bwd, generator fwd
    second = model.train_flops(20, 3, log["masked"])
    assert second > first
    # a resumed model keeps the switch (the flag is in the state dict, not recomputed)
    resumed, _ = tiny_model(task, generator="two_stage", two_stage_updates=3)
    resumed.load_state_dict(model.state_dict())
    assert bool(resumed.second_stage)
    before = {k: v.clone() for k, v in resumed.discriminator.state_dict().items()}
    resumed.set_num_updates(4)
    assert all(torch.equal(before[k], v) for k, v in resumed.discriminator.state_dict().items())


# ------------------------------------------------------------------------ FLOPs per objective


def test_paper_flops_of_mlm_by_hand():
    """The hand-computed model of test_fast_path with the BERT objective: no generator, an
    MLM head of the discriminator's size at the one predicted position."""
    disc = EncoderSize(layers=1, hidden=4, heads=1, ffn=8, embedding=2)
    # per position: attention 247 + FFN 244 + embeddings 102 (see test_fast_path); MLM head
    # 2*4*2 + 2 + 8*2 + 5*2 + 2*2*10 + 5*10 + 2*10 = 154 at the predicted position
    forward = 3 * (247 + 244 + 102) + 154
    mlm = paper_encoder_flops(disc, 10, 3, 3) + OBJECTIVES["mlm"].paper_head_flops(disc, 10, 3, 1)
    assert mlm == forward
    # the 15% variant counts the same replaced-token head at every position as electra
    assert OBJECTIVES["electra_15"].paper_head_flops(disc, 10, 3, 1) == \
        OBJECTIVES["electra"].paper_head_flops(disc, 10, 3, 1) == 3 * (2 * 4 * 4 + 4 + 8 * 4 + 8)


# ------------------------------------------------------------------------ fairseq machinery


@pytest.mark.slow
@pytest.mark.parametrize("options, loss_key", [
    (["--objective", "electra_15"], "disc_loss"),
    (["--objective", "mlm", "--leave-unmasked-prob", "0.1", "--random-token-prob", "0.1"],
     "mlm_loss"),
    (["--objective", "replace_mlm"], "mlm_loss"),
    (["--objective", "all_tokens_mlm"], "mlm_loss"),
    (["--generator", "unigram"], "disc_loss"),
    (["--generator", "tied"], "disc_loss"),
    (["--generator", "adversarial"], "disc_loss"),
    (["--generator-layers", "0.5"], "disc_loss"),
    (["--embedding-sharing", "gdes"], "disc_loss"),
])
def test_each_variant_trains_with_fairseq_train(options, loss_key, data_bin, tmp_path):
    result = run_here(train_cmd(data_bin, tmp_path, "--max-update", "3", "--no-save",
                                "--disable-validation", *options))
    assert result.returncode == 0, result.stderr[-3000:]
    logs = records(result.stdout)
    assert [r["num_updates"] for r in logs] == [1, 2, 3]
    assert all(math.isfinite(r[loss_key]) for r in logs)
    flops = [r["train_flops"] for r in logs]
    assert flops[0] > 0 and flops[2] == pytest.approx(3 * flops[0], rel=0.05)


@pytest.mark.slow
def test_two_stage_run_switches_at_the_update_and_resumes(data_bin, tmp_path):
    options = ["--generator", "two_stage", "--two-stage-updates", "3", "--train-subset", "valid",
               "--disable-validation"]
    first = run_here(train_cmd(data_bin, tmp_path, "--max-epoch", "1", *options))
    assert first.returncode == 0, first.stderr[-3000:]
    stage_one = records(first.stdout)
    assert all("disc_loss" not in r for r in stage_one)  # updates 1..3: generator alone
    shutil.copy(tmp_path / "checkpoint_last.pt", tmp_path / "stage_one.pt")
    resumed = run_here(train_cmd(data_bin, tmp_path, "--max-epoch", "2", *options))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    stage_two = records(resumed.stdout)
    assert [r["num_updates"] for r in stage_two] == [4, 5, 6]
    assert all("disc_loss" in r and "gen_loss" not in r for r in stage_two)
    assert "discriminator initialised from the generator" in resumed.stderr + resumed.stdout
    state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)["model"]
    assert bool(state["second_stage"])
    # the frozen generator samples from the same distribution after the second stage's
    # updates: the discriminator's updates do not reach it through shared embeddings
    import_plugin()
    before, after = (generator_log_probs(tmp_path / name, data_bin)
                     for name in ("stage_one.pt", "checkpoint_last.pt"))
    assert torch.equal(before, after)
    changed = torch.load(tmp_path / "stage_one.pt", weights_only=False)["model"]
    assert not torch.equal(changed["discriminator.encoder.layer.0.output.dense.weight"],
                           state["discriminator.encoder.layer.0.output.dense.weight"])


def generator_log_probs(path, data_bin):
    """The generator's log-probabilities at the masked positions of a fixed valid batch."""
    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(data_bin)})
    task.load_dataset("valid")
    batch = task.dataset("valid").collater([task.dataset("valid")[i] for i in range(4)])
    model.eval()
    src, target = batch["net_input"]["src_tokens"], batch["target"]
    with torch.no_grad():
        return model(src, target=target).generator_log_probs


@pytest.mark.slow
def test_objective_from_hydra(data_bin, tmp_path):
    stdout, save_dir = hydra_train(tmp_path, data_bin, "optimization.max_update=2",
                                   "model.objective=mlm",
                                   "task.random_token_prob=0.1",
                                   "task.leave_unmasked_prob=0.1")
    logs = records(stdout)
    assert logs and all("mlm_loss" in r and "disc_loss" not in r for r in logs)
    cfg = torch.load(save_dir / "checkpoint_last.pt", weights_only=False)["cfg"]
    assert cfg["model"]["objective"] == "mlm" and cfg["task"]["random_token_prob"] == 0.1


@pytest.mark.parametrize("options, phrase", [
    (dict(objective="mlm", generator="unigram"), "--objective mlm has no generator, so "
                                                 "--generator does not apply"),
    (dict(objective="mlm", embedding_sharing="gdes"), "so --embedding-sharing does not apply"),
    (dict(objective="mlm", generator_layers=0.5), "so --generator-layers does not apply"),
    (dict(generator="unigram", generator_layers=0.5),
     "--generator-layers does not apply to --generator unigram"),
    (dict(generator="tied", generator_size=0.5),
     "--generator-size does not apply to --generator tied"),
    (dict(generator="two_stage"), "give --two-stage-updates N"),
    (dict(generator="two_stage", two_stage_updates=5, generator_layers=0.5),
     "--generator-layers does not apply to --generator two_stage"),
    (dict(two_stage_updates=5), "--two-stage-updates does not apply to --generator masked_lm"),
    (dict(generator="adversarial", two_stage_updates=5),
     "--two-stage-updates does not apply to --generator adversarial"),
    (dict(objective="replace_mlm", generator="adversarial"), "--objective electra"),
    (dict(objective="all_tokens_mlm", generator="two_stage", two_stage_updates=5),
     "--generator two_stage is defined for replaced token detection"),
    (dict(embedding_sharing="gdes", generator="unigram"),
     "--generator unigram works with --embedding-sharing shared, not gdes"),
    (dict(embedding_sharing="gdes", generator="tied"), "--generator tied works with"),
    (dict(embedding_sharing="shared", generator="two_stage", two_stage_updates=5),
     "--generator two_stage works with --embedding-sharing untied, not shared"),
    (dict(generator="fast_electra"), "--generator-checkpoint PATH"),
    (dict(generator_checkpoint="mlm.pt"), "--generator-checkpoint does not apply"),
    (dict(temperature_decay_updates=10), "--temperature-decay-updates does not apply"),
])
def test_impossible_combinations_are_one_line_errors(options, phrase):
    with pytest.raises(ElectraUsageError, match=phrase.replace("-", r"\-")):
        tiny_model(**options)


@pytest.mark.slow
def test_bad_masking_fractions_and_fp16_two_stage_are_one_line(data_bin, tmp_path):
    assert_usage_error(train_cmd(data_bin, tmp_path, "--leave-unmasked-prob", "0.6",
                                 "--random-token-prob", "0.6"),
                       "--random-token-prob", "add up to at most 1")
    assert_usage_error(train_cmd(data_bin, tmp_path, "--generator", "two_stage",
                                 "--two-stage-updates", "2", "--fp16", "--fp16-no-flatten-grads",
                                 "--max-update", "1"),
                       "--generator two_stage", "--amp")
    assert not any(tmp_path.iterdir())  # nothing written
    assert_usage_error(train_cmd(data_bin, tmp_path, "--generator-layers", "0.3"),
                       "--generator-layers 0.3", "use a multiple of 1/2 in (0, 1]")
