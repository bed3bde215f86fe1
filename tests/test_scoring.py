"""Sentence scoring and n-best re-ranking (electra-score): the one-pass Electric score and
the masked LM's pseudo-log-likelihood against brute force on a tiny model, scores that do
not depend on batching, re-ranking with hand-made language scores, fairseq-generate input."""

import json
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from electra_plugin.cli import score as score_cli
from electra_plugin.finetuning import scoring
from electra_plugin.models.electra import ElectraModel
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import SHORT, assert_main_error, assert_usage_line, tiny_model


def sentences(task, lengths=(9, 4, 14, 3, 9, 12), seed=0):
    """Random real tokens between <s> and </s>, of the given lengths (specials included)."""
    g = torch.Generator().manual_seed(seed)
    d = task.dictionary
    rows = []
    for length in lengths:
        inner = torch.randint(d.nspecial, len(d) - 1, (length - 2,), generator=g)
        rows.append(torch.cat([torch.tensor([d.bos()]), inner, torch.tensor([d.eos()])]))
    return rows


def brute_force_electric(model, rows):
    """A forward per sentence; -sum of the head's outputs between <s> and </s>."""
    model.eval()
    with torch.no_grad():
        return [-model(row[None])[0][0, 1:-1].double().sum().item() for row in rows]


def brute_force_pll(encoder, head, mask_idx, rows):
    """A forward per token: that token masked, log p(original) summed."""
    scores = []
    with torch.no_grad():
        for row in rows:
            total = 0.0
            for t in range(1, len(row) - 1):
                masked = row.clone()
                masked[t] = mask_idx
                hidden, _ = encoder(masked[None])
                total += F.log_softmax(head(hidden[0, t:t + 1]), -1)[0, row[t]].item()
            scores.append(total)
    return scores


# ------------------------------------------------------------------------------ (a) brute force

def test_electric_score_is_minus_the_energies_of_the_real_tokens():
    model, task = tiny_model()
    rows = sentences(task)
    scores = scoring.SentenceScorer(model, "electric", batch_size=4)(rows)
    assert scores == pytest.approx(brute_force_electric(model, rows), abs=1e-5)
    assert len(set(scores)) == len(scores)  # the scores tell the sentences apart


@pytest.mark.parametrize("objective", ["electra", "mlm"])
def test_pseudo_log_likelihood_is_one_masked_forward_per_token(objective):
    """The generator of an electra checkpoint; the discriminator and mlm_head of an mlm one."""
    model, task = tiny_model(objective=objective)
    model.eval()
    parts = (model.generator, model.generator_head) if objective == "electra" else \
        (model.discriminator, model.mlm_head)
    rows = sentences(task, lengths=(7, 3, 11, 5))
    scores = scoring.SentenceScorer(model, "mlm", task.mask_idx, batch_size=6)(rows)
    assert scores == pytest.approx(brute_force_pll(*parts, task.mask_idx, rows), abs=1e-5)
    assert scores[1] < 0  # one real token: its own log-probability


# ------------------------------------------------------------------------------ (b) batching

@pytest.mark.parametrize("kind", scoring.SCORERS)
def test_batching_and_padding_do_not_change_scores(kind):
    model, task = tiny_model()
    rows = sentences(task, lengths=(12, 3, 8, 12, 5, 16, 4), seed=3)
    alone = scoring.SentenceScorer(model, kind, task.mask_idx, batch_size=1)(rows)
    for batch_size in (2, 5, 64):
        batched = scoring.SentenceScorer(model, kind, task.mask_idx, batch_size)(rows)
        assert batched == pytest.approx(alone, abs=1e-5)
    # padded next to a longer sentence, in any order: the same score per sentence
    reordered = scoring.SentenceScorer(model, kind, task.mask_idx, 64)(rows[::-1])
    assert reordered[::-1] == pytest.approx(alone, abs=1e-5)
    assert scoring.SentenceScorer(model, kind, task.mask_idx)([]) == []


def test_a_checkpoint_without_the_scorer_s_head_is_one_line():
    mlm_model, task = tiny_model(objective="mlm")
    with pytest.raises(ElectraUsageError) as caught:
        scoring.SentenceScorer(mlm_model, "electric")
    assert_usage_line(caught.value, "--scorer electric", "discriminator_head", "--scorer mlm")
    finetuning = ElectraModel(mlm_model.cfg, task.dictionary, pretraining=False)
    with pytest.raises(ElectraUsageError) as caught:
        scoring.SentenceScorer(finetuning, "mlm", task.mask_idx)
    assert_usage_line(caught.value, "--scorer mlm needs a masked LM")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", scoring.SCORERS)
def test_scores_on_the_gpu_are_the_cpu_s(kind):
    model, task = tiny_model()
    rows = sentences(task)
    on_cpu = scoring.SentenceScorer(model, kind, task.mask_idx, batch_size=4)(rows)
    on_gpu = scoring.SentenceScorer(model.cuda(), kind, task.mask_idx, batch_size=4)(rows)
    assert on_gpu == pytest.approx(on_cpu, rel=1e-4, abs=1e-4)


# ------------------------------------------------------------------------------ (d) inputs

GENERATED = """2024-01-01 00:00:00 | INFO | fairseq_cli.generate | loading model
S-1\tle chat voit une maison
T-1\tthe cat sees a house today
H-1\t-0.40\tthe cat sees the house today
D-1\t-0.40\tthe cat sees the house today
P-1\t-0.1 -0.2 -0.3 -0.4 -0.5 -0.6 -0.7
H-1\t-0.55\tthe cat sees a house today
S-0\tun chien
T-0\ta dog likes the ball
H-0\t-0.20\ta dog likes a ball
H-0\t-0.30\t
Generate test with beam=2: BLEU4 = 10.00
"""


def test_fairseq_generate_output_is_read_in_file_order(tmp_path):
    path = tmp_path / "gen.txt"
    path.write_text(GENERATED)
    nbest = scoring.read_input(path)
    assert [(h.id, h.rank, h.model_score, h.text) for h in nbest.hypotheses] == [
        (1, 0, -0.40, "the cat sees the house today"), (1, 1, -0.55, "the cat sees a house today"),
        (0, 0, -0.20, "a dog likes a ball"), (0, 1, -0.30, "")]
    assert nbest.references == {1: "the cat sees a house today", 0: "a dog likes the ball"}
    assert nbest.sources[0] == "un chien" and nbest.scored_by_a_model


def test_plain_text_is_a_hypothesis_per_line(tmp_path):
    path = tmp_path / "hyps.txt"
    path.write_text("the cat sees a house\n\nHELLO-1 world\n")
    nbest = scoring.read_input(path)
    assert [(h.id, h.rank, h.text) for h in nbest.hypotheses] == [
        (0, 0, "the cat sees a house"), (1, 0, ""), (2, 0, "HELLO-1 world")]
    assert all(math.isnan(h.model_score) for h in nbest.hypotheses)
    with pytest.raises(ElectraUsageError, match="no translation scores"):
        scoring.rerank(nbest, [0.0] * 3, 0.1)


@pytest.mark.parametrize("bad", ["H-1\tnot-a-score\tthe cat", "H-1 -0.5 the cat",
                                 "H-x\t-0.5\tthe cat", "T-1"])
def test_a_malformed_generate_line_is_one_line_naming_it(tmp_path, bad):
    path = tmp_path / "gen.txt"
    lines = GENERATED.splitlines()
    lines[4] = bad
    path.write_text("\n".join(lines) + "\n")
    # the command's own edge: rerank reads --nbest as fairseq-generate output
    scores = tmp_path / "scores.tsv"
    scores.write_text("\t".join(scoring.SCORE_HEADER) + "\n")
    line = assert_main_error(score_cli.main, ["rerank", "--nbest", path, "--lm-scores", scores,
                                              "--weight", "0.1"], "line 5", "fairseq-generate")
    assert repr(bad[:60]) in line


def test_text_without_hypotheses_is_refused_as_generate_output(tmp_path):
    path = tmp_path / "plain.txt"
    path.write_text("just a sentence\n")
    with pytest.raises(ElectraUsageError, match="has no H- lines"):
        scoring.read_input(path, "generate")


# ------------------------------------------------------------------------------ (c) re-ranking

# Per sentence: (reference, [(hypothesis, translation score, language score)]). The language
# score rescues the right hypothesis of sentence 0 once w > 0.2 / 15 and loses the one of
# sentence 1 once w > 1.5 / 9: on the grid only w = 0.1 gets both right.
DEV = {
    0: ("the cat sat on the warm mat", [("the cat sat on a mat warm", -1.0, -20.0),
                                        ("the cat sat on the warm mat", -1.2, -5.0)]),
    1: ("a dog likes the red ball", [("a dog likes the red ball", -0.5, -12.0),
                                     ("a dog likes", -2.0, -3.0)]),
}
TEST = {
    7: ("my neighbour paints the green door", [("my neighbour paint green door the", -0.3,
                                                -30.0),
                                               ("my neighbour paints the green door", -0.9,
                                                -10.0),
                                               ("my neighbour", -3.0, -1.0)]),
}
GRID = [0.0, 0.01, 0.1, 1.0]


def write_nbest(path, sets):
    """fairseq-generate output of the hand-made sets; -> their language scores."""
    lines, language = [], []
    for sentence, (reference, hyps) in sets.items():
        lines += [f"S-{sentence}\tsource {sentence}", f"T-{sentence}\t{reference}"]
        for text, model, lm in hyps:
            lines.append(f"H-{sentence}\t{model}\t{text}")
            language.append(lm)
    path.write_text("\n".join(lines) + "\n")
    return language


def test_the_tuned_weight_is_the_grid_s_best_on_dev_and_picks_the_right_test_hypothesis(
        tmp_path):
    write_nbest(tmp_path / "dev.gen.txt", DEV)
    write_nbest(tmp_path / "test.gen.txt", TEST)
    table = {text: lm for sets in (DEV, TEST) for _, hyps in sets.values()
             for text, _, lm in hyps}

    def scorer(texts):  # the injected language model: the hand-made scores
        return [table[t] for t in texts]

    dev = scoring.read_input(tmp_path / "dev.gen.txt")
    weight, grid = scoring.weight_search(dev, scorer([h.text for h in dev.hypotheses]), GRID)
    assert [w for w, _ in grid] == GRID
    assert weight == max(grid, key=lambda row: row[1])[0] == 0.1
    bleu = dict(grid)
    assert bleu[0.1] == pytest.approx(100.0) and max(bleu[0.0], bleu[1.0]) < 100.0
    test = scoring.read_input(tmp_path / "test.gen.txt")
    language = scorer([h.text for h in test.hypotheses])
    assert scoring.rerank(test, language, 0.0)[7].rank == 0  # the translation model's choice
    assert scoring.rerank(test, language, weight)[7].text == TEST[7][0]
    assert scoring.rerank(test, language, 1.0)[7].text == "my neighbour"


def test_rerank_command_with_precomputed_score_files(tmp_path, capsys):
    files = {}
    for name, sets in (("dev", DEV), ("test", TEST)):
        nbest_path = tmp_path / f"{name}.gen.txt"
        language = write_nbest(nbest_path, sets)
        with open(tmp_path / f"{name}.scores.tsv", "w") as f:
            scoring.write_scores(f, scoring.read_input(nbest_path), language)
        files[name] = nbest_path, tmp_path / f"{name}.scores.tsv"
    out = tmp_path / "test.reranked.txt"
    score_cli.main([str(a) for a in (
        "rerank", "--nbest", files["dev"][0], "--lm-scores", files["dev"][1], "--weight-search",
        "--grid", ",".join(map(str, GRID)), "--test", files["test"][0], "--test-lm-scores",
        files["test"][1], "--out", out, "--json")])
    printed = capsys.readouterr()
    result = json.loads(printed.out)  # --json: the one object alone; the grid on stderr
    assert result["weight"] == 0.1 and [w for w, _ in result["grid"]] == GRID
    assert any(line.strip().startswith("w=0.1 ") and line.endswith("<- best")
               for line in printed.err.splitlines())
    assert result["nbest_bleu_after"] == pytest.approx(100.0)
    assert result["test_bleu_after"] == pytest.approx(100.0)
    assert result["test_bleu_before"] < 100.0
    assert out.read_text() == TEST[7][0] + "\n"
    # a score file of another n-best list is refused in one line
    assert_main_error(score_cli.main, ["rerank", "--nbest", files["test"][0], "--lm-scores",
                                       files["dev"][1], "--weight", "0.1"],
                      "scores 4 hypotheses", "has 3")


def test_rerank_options_are_checked(tmp_path):
    nbest = tmp_path / "dev.gen.txt"
    write_nbest(nbest, DEV)
    for argv, phrase in ((["--lm-scores", "x.tsv"], "--weight-search"),
                         (["--weight", "1"], "--checkpoint"),
                         (["--weight", "1", "--lm-scores", "x", "--test", "t"],
                          "--test-lm-scores"),
                         (["--weight-search", "--lm-scores", "x", "--grid", "0,a"], "--grid")):
        with pytest.raises(ElectraUsageError) as caught:
            score_cli.main(["rerank", "--nbest", str(nbest), *argv])
        assert phrase in str(caught.value)


def test_without_sacrebleu_bleu_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    write_nbest(tmp_path / "dev.gen.txt", DEV)
    dev = scoring.read_input(tmp_path / "dev.gen.txt")
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    with pytest.raises(ElectraUsageError) as caught:
        scoring.corpus_bleu(dev, scoring.rerank(dev, [0.0] * 4, 0.0))
    assert_usage_line(caught.value, "re-ranking n-best lists by BLEU needs",
                      "pip install 'electra-fairseq[bleu]'")


def test_bleu_needs_the_references(tmp_path):
    path = tmp_path / "gen.txt"
    path.write_text("H-0\t-0.1\ta dog likes the ball\n")
    nbest = scoring.read_input(path)
    with pytest.raises(ElectraUsageError, match="no T- reference for sentence 0"):
        scoring.corpus_bleu(nbest, scoring.rerank(nbest, [0.0], 0.0))


# ------------------------------------------------------------------------------ the command

@pytest.mark.slow  # pretrained: a fairseq-train run
def test_score_command_on_a_pretrained_checkpoint(tmp_path, pretrained, spm_data, capsys,
                                                  monkeypatch):
    text = tmp_path / "hyps.txt"
    lines = SHORT.split(" . ")[:1] + ["a dog likes the ball .", "ball the likes dog a ."]
    text.write_text("\n".join(lines) + "\n")
    hub = ElectraModel.from_pretrained(str(pretrained.parent), pretrained.name, str(spm_data))
    rows = [hub.encode(line) for line in lines]
    # a relative data directory is found as fairseq's RoBERTa hub finds it: from the model's
    # directory when it starts with '.', else from the working directory
    monkeypatch.chdir(spm_data.parent)
    for data in (spm_data.name, os.path.relpath(spm_data, pretrained.parent)):
        relative = ElectraModel.from_pretrained(str(pretrained.parent), pretrained.name, data)
        assert torch.equal(relative.encode(lines[1]), rows[1]), data
    for kind in scoring.SCORERS:
        out = tmp_path / f"{kind}.tsv"
        score_cli.main(["score", "--checkpoint", str(pretrained), "--data", str(spm_data),
                        "--input", str(text), "--scorer", kind, "--cpu", "--out", str(out)])
        header, *body = out.read_text().splitlines()
        assert header.split("\t") == list(scoring.SCORE_HEADER)
        fields = [row.split("\t") for row in body]
        assert [(f[0], f[1], f[2]) for f in fields] == [(str(i), "0", "nan") for i in range(3)]
        expected = brute_force_electric(hub.model, rows) if kind == "electric" else \
            brute_force_pll(hub.model.generator, hub.model.generator_head, hub.task.mask_idx,
                            rows)
        assert [float(f[3]) for f in fields] == pytest.approx(expected, abs=1e-5)
    # fairseq-generate output through the command: a score per H- line, in its order
    generated = tmp_path / "gen.txt"
    generated.write_text(GENERATED)
    score_cli.main(["score", "--checkpoint", str(pretrained), "--data", str(spm_data),
                    "--input", str(generated), "--cpu", "--out", str(tmp_path / "gen.tsv")])
    body = (tmp_path / "gen.tsv").read_text().splitlines()[1:]
    assert [row.split("\t")[:3] for row in body] == [
        ["1", "0", "-0.400000"], ["1", "1", "-0.550000"], ["0", "0", "-0.200000"],
        ["0", "1", "-0.300000"]]
    assert float(body[-1].split("\t")[3]) == 0.0  # an empty hypothesis: no real token
    # re-ranking scored by the checkpoint itself
    score_cli.main(["rerank", "--checkpoint", str(pretrained), "--data", str(spm_data),
                    "--nbest", str(generated), "--weight-search", "--scorer", "mlm", "--cpu", "--json"])
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert result["weight"] in [w for w, _ in result["grid"]]
    assert 0 <= result["nbest_bleu_after"] <= 100
    with pytest.raises(ElectraUsageError, match="hypothesis 1: the input has"):
        scoring.text_scorer(hub, "electric")([" ".join(["the cat"] * 400)])
