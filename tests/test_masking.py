"""Masking rates and reproducibility of the electra task on a real binarized batch stream."""

import numpy as np
import pytest
import torch

import electra_plugin  # noqa: F401  (registers the task)
from electra_plugin.tasks.electra_pretraining import (
    ElectraPretrainingConfig,
    ElectraPretrainingTask,
)


def make_task(data_bin, **overrides):
    cfg = ElectraPretrainingConfig(data=str(data_bin), tokens_per_sample=64, seed=7, **overrides)
    task = ElectraPretrainingTask.setup_task(cfg)
    task.load_dataset("train")
    return task


def batches(task, epoch=1, max_sentences=16):
    itr = task.get_batch_iterator(task.dataset("train"), max_sentences=max_sentences, seed=7,
                                  epoch=epoch)
    return list(itr.next_epoch_itr(shuffle=False))


@pytest.fixture(scope="module")
def task(data_bin):
    return make_task(data_bin)


def picked_and_candidates(task, batch):
    """(positions picked for the generator, positions that may be picked), both B x T."""
    d = task.dictionary
    src, tgt = batch["net_input"]["src_tokens"], batch["target"]
    is_picked = tgt.ne(d.pad())
    original = torch.where(is_picked, tgt, src)
    special = torch.tensor([d.bos(), d.eos(), d.pad(), task.mask_idx])
    return is_picked, ~torch.isin(original, special)


def test_official_rates_on_a_batch_stream(task):
    picked = candidates = masked = kept = 0
    for batch in batches(task):
        src, tgt = batch["net_input"]["src_tokens"], batch["target"]
        is_picked, is_candidate = picked_and_candidates(task, batch)
        assert not (is_picked & ~is_candidate).any(), "a special token was picked"
        # per sample, exactly round(0.15 * candidates) positions are picked
        for row_picked, row_cand in zip(is_picked.sum(1), is_candidate.sum(1)):
            assert row_picked == max(1, round(0.15 * int(row_cand)))
        # a picked position is either <mask> or its original token: no random tokens
        picked_src = src[is_picked]
        assert torch.all((picked_src == task.mask_idx) | (picked_src == tgt[is_picked]))
        assert not src[~is_picked].eq(task.mask_idx).any()
        picked += int(is_picked.sum())
        candidates += int(is_candidate.sum())
        masked += int(picked_src.eq(task.mask_idx).sum())
        kept += int(picked_src.ne(task.mask_idx).sum())
    assert picked > 1000
    assert abs(picked / candidates - 0.15) < 0.005
    # 85% <mask>, 15% unchanged; binomial std over >1000 picks is ~0.011
    assert abs(masked / picked - 0.85) < 0.035
    assert abs(kept / picked - 0.15) < 0.035


def test_mask_prob_option_changes_the_rate(data_bin):
    task = make_task(data_bin, mask_prob=0.25, leave_unmasked_prob=0.0)
    picked = candidates = 0
    for batch in batches(task):
        is_picked, is_candidate = picked_and_candidates(task, batch)
        picked += int(is_picked.sum())
        candidates += int(is_candidate.sum())
        assert batch["net_input"]["src_tokens"][is_picked].eq(task.mask_idx).all()
    assert abs(picked / candidates - 0.25) < 0.01


def test_masks_are_a_function_of_seed_epoch_and_index(data_bin, task):
    first = batches(task, epoch=1)
    again = batches(make_task(data_bin), epoch=1)  # a fresh task, as after a restart
    for a, b in zip(first, again):
        assert torch.equal(a["id"], b["id"])
        assert torch.equal(a["net_input"]["src_tokens"], b["net_input"]["src_tokens"])
        assert torch.equal(a["target"], b["target"])
    # another epoch masks the same text differently
    second = {int(i): row for b in batches(task, epoch=2)
              for i, row in zip(b["id"], b["target"])}
    same = sum(torch.equal(row, second[int(i)]) for b in first
               for i, row in zip(b["id"], b["target"]))
    assert same < 0.1 * sum(len(b["id"]) for b in first)


def test_dictionary_gets_mask_appended_like_sentence_prediction(data_bin, task):
    from fairseq.data import Dictionary

    plain = Dictionary.load(str(data_bin / "dict.txt"))
    assert "<mask>" not in plain.indices
    # fairseq's sentence_prediction appends <mask> the same way: identical ids
    assert task.mask_idx == plain.add_symbol("<mask>") == len(plain) - 1
    assert len(task.dictionary) == len(plain)
    assert np.all([task.dictionary[i] == plain[i] for i in range(len(plain))])
