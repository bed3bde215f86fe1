"""Pre-training examples as the official builder makes them (--sample-break-mode
segment_pairs): the rules on a hand-checked case, the examples of a real binarized corpus, a
real fairseq-train run that trains token type 1, exact resume, and fine-tuning that reads
pairs as the checkpoint was trained."""

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary, data_utils

from electra_plugin.data.segment_pairs import SegmentPairDataset, build_examples
from electra_plugin.models.electra import segment_ids
from helpers import (
    assert_same_params, assert_usage_error, checkpoint, records, run_here, train_cmd, failure,
)

SEGMENTS = ("--sample-break-mode", "segment_pairs", "--segment-token-types")
TYPE_EMBEDDINGS = "discriminator.embeddings.token_type_embeddings.weight"


class ScriptedDraws:
    """The builder's random draws, given in the order the rules take them."""

    def __init__(self, samples, integers=()):
        self.samples, self.integers = list(samples), list(integers)

    def random_sample(self):
        return self.samples.pop(0)

    def randint(self, low, high):
        value = self.integers.pop(0)
        assert low <= value < high
        return value


def test_official_rules_on_a_hand_checked_case():
    # lines of 3, 4, 2 tokens, a document end, 5 and 6 tokens, an end, then 2 tokens
    lengths = np.array([3, 4, 2, 0, 5, 6, 0, 2])
    draws = ScriptedDraws([
        0.5,  # example 1: two segments, the first aiming at (12 - 3) // 2 = 4 tokens
        0.3,  # line 1 would take A past 4, B is empty and A short of 4: a coin, < 0.5: A
        0.9,  # next target: 12
        0.05,  # example 2: one segment (< 0.1)
        0.01,  # next target shorter (< 0.05): randint -> 6
        0.5,  # example 3 (the rest at the end): A aims at (6 - 3) // 2 = 1
        0.9,
    ], integers=[6])
    examples = build_examples(lengths, 12, draws)
    assert examples == [
        ([0, 1], [2], 7, 2),  # line 2 does not fit A (7 + 2 >= 4) and A is past its aim
        ([4, 5], [], 10, 0),  # 11 tokens in one segment, cut to 12 - 2
        ([7], [], 2, 0),  # the last lines end an example too
    ]
    assert not draws.samples and not draws.integers
    # a document longer than the target: an example as soon as the lines reach it
    draws = ScriptedDraws([0.5, 0.9, 0.5, 0.9])
    assert build_examples(np.array([6, 7, 4]), 12, draws) == [([0], [1], 6, 3), ([2], [], 4, 0)]


def test_under_the_graphed_step_every_batch_takes_the_full_length(data_bin):
    """segment_pairs batches come in several lengths (fairseq batches by size), each of
    which the graphed step would compile anew: under --graphed-step every batch is padded to
    --tokens-per-sample instead."""
    from electra_plugin.tasks.electra_pretraining import (
        ElectraPretrainingConfig, ElectraPretrainingTask)

    lengths = {}
    for graphed in (False, True):
        cfg = ElectraPretrainingConfig(data=str(data_bin), sample_break_mode="segment_pairs",
                                       tokens_per_sample=64, graphed_step=graphed, seed=1)
        task = ElectraPretrainingTask(cfg, Dictionary.load(str(data_bin / "dict.txt")))
        task.load_dataset("train")
        batches = task.get_batch_iterator(task.dataset("train"), max_sentences=8, seed=1)
        lengths[graphed] = {batch["net_input"]["src_tokens"].size(1)
                            for batch in batches.next_epoch_itr(shuffle=False)}
    assert len(lengths[False]) > 2 and max(lengths[False]) == 64, lengths
    assert lengths[True] == {64}


@pytest.fixture(scope="module")
def pairs(data_bin):
    d = Dictionary.load(str(data_bin / "dict.txt"))
    lines = data_utils.load_indexed_dataset(str(data_bin / "train"), d)
    return d, lines, SegmentPairDataset(lines, 32, d.bos(), d.eos(), seed=1)


def test_examples_of_a_real_corpus(pairs):
    d, lines, dataset = pairs
    text = [lines[i][:-1].tolist() for i in range(len(lines))]
    singles = 0
    for i in range(len(dataset)):
        tokens = dataset[i].tolist()
        first, second, first_len, second_len = dataset.examples[i]
        assert len(tokens) == dataset.sizes[i] <= 32
        assert tokens[0] == d.bos() and tokens[-1] == d.eos()
        # A then B: their lines' tokens in order, each cut as the rules say
        a = sum((text[j] for j in first), [])[:first_len]
        assert tokens[1:1 + first_len] == a and tokens[1 + first_len] == d.eos()
        if second_len:
            assert tokens[2 + first_len:-1] == sum((text[j] for j in second), [])[:second_len]
        else:
            singles += 1
            assert len(tokens) == first_len + 2
        # never across a document end (an empty line, which is a lone </s>)
        spans = first + second
        assert all(len(text[j]) for j in spans)
        assert not any(len(text[j]) == 0 for j in range(min(spans), max(spans)))
    # one in ten examples asks for one segment, and a document's last few lines may too
    assert 0.08 < singles / len(dataset) < 0.6
    again = SegmentPairDataset(lines, 32, d.bos(), d.eos(), seed=1)
    assert again.examples == dataset.examples  # seeded: the same examples every run
    assert SegmentPairDataset(lines, 32, d.bos(), d.eos(), seed=2).examples != dataset.examples


def test_token_types_of_an_example(pairs):
    d, _, dataset = pairs
    i = next(i for i, e in enumerate(dataset.examples) if e[3])  # one with two segments
    tokens = dataset[i]
    types = segment_ids(tokens[None], d.eos(), d.pad())[0].tolist()
    first_len = dataset.examples[i][2]
    assert types == [0] * (first_len + 2) + [1] * (len(tokens) - first_len - 2)


def test_segment_pairs_need_segment_token_types(data_bin, tmp_path):
    assert_usage_error(train_cmd(data_bin, tmp_path / "ck", "--sample-break-mode",
                                 "segment_pairs", "--max-update", "1"),
                       "--sample-break-mode segment_pairs gives the second segment token "
                       "type 1: add --segment-token-types")


@pytest.mark.slow
def test_pretraining_on_pairs_trains_type_one_and_resumes_exactly(data_bin, tmp_path):
    once, twice, packed = tmp_path / "once", tmp_path / "twice", tmp_path / "packed"
    for save, updates in ((once, 4), (twice, 2), (twice, 4)):
        proc = run_here(train_cmd(data_bin, save, *SEGMENTS, "--max-update", str(updates)))
        assert proc.returncode == 0, failure("fairseq-train", proc)
    assert [r["num_updates"] for r in records(proc.stdout)] == [3, 4]
    a, b = checkpoint(once / "checkpoint_last.pt"), checkpoint(twice / "checkpoint_last.pt")
    assert_same_params(a["model"], b["model"], atol=1e-6, what="resumed vs uninterrupted")
    proc = run_here(train_cmd(data_bin, packed, "--max-update", "4"))
    assert proc.returncode == 0, failure("fairseq-train", proc)
    # the same seed gives both runs the same initial rows; packed text never reads type 1,
    # so its row 1 gets no gradient and stays as initialised, where pairs train it
    pairs_rows, packed_rows = (checkpoint(p / "checkpoint_last.pt")["model"][TYPE_EMBEDDINGS]
                               for p in (once, packed))
    assert (pairs_rows[1] - packed_rows[1]).abs().max() > 1e-4
    assert a["cfg"]["task"]["sample_break_mode"] == "segment_pairs"
    assert a["cfg"]["model"]["segment_token_types"] is True


@pytest.mark.slow
def test_finetuning_reads_pairs_as_the_checkpoint_was_trained(tmp_path, spm_data):
    """A checkpoint pre-trained on segment pairs gives its fine-tuning --segment-token-types
    without the flag; the fine-tuned checkpoint keeps it, so evaluation reads pairs alike."""
    import sys

    from helpers import PLUGIN, write_rte

    from electra_plugin.cli import glue as glue_cli

    pre = tmp_path / "pre"
    proc = run_here(train_cmd(spm_data, pre, *SEGMENTS, "--max-update", "2"))
    assert proc.returncode == 0, failure("fairseq-train", proc)
    glue_cli.main(["preprocess", "--task", "RTE", "--glue-dir",
                   str(write_rte(tmp_path / "RTE", 16, 8)), "--pretrain-data", str(spm_data),
                   "--destdir", str(tmp_path / "rte")])
    ft = tmp_path / "ft"
    proc = run_here([sys.executable, "-m", "fairseq_cli.train", tmp_path / "rte", "--user-dir",
                     PLUGIN, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                     "--arch", "electra_tiny", "--num-layers", "2", "--hidden-size", "64",
                     "--num-heads", "4", "--ffn-size", "128", "--embedding-size", "32",
                     "--num-classes", "2", "--init-token", "0", "--cpu", "--optimizer", "adam",
                     "--lr", "1e-4", "--batch-size", "8", "--max-update", "2", "--save-dir", ft,
                     "--finetune-from-model", pre / "checkpoint_last.pt", "--num-workers", "0",
                     "--data-buffer-size", "0"])
    assert proc.returncode == 0, failure("fine-tuning", proc)
    assert "pairs read with token type 1 on the second segment" in proc.stdout + proc.stderr
    assert checkpoint(ft / "checkpoint_last.pt")["cfg"]["model"]["segment_token_types"] is True
    from electra_plugin.models.hub_interface import from_pretrained

    hub = from_pretrained(str(ft), "checkpoint_last.pt", str(tmp_path / "rte"))
    tokens = hub.encode("the cat sees a house .", "a dog likes the ball .")[None]
    x, _ = hub.model(tokens, features_only=True)
    typed, _ = hub.model(tokens, features_only=True,
                         token_types=segment_ids(tokens, 2, 1))
    untyped, _ = hub.model(tokens, features_only=True, token_types=torch.zeros_like(tokens))
    assert torch.equal(x, typed) and not torch.allclose(x, untyped)
