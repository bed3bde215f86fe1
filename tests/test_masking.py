"""Masking rates and reproducibility of the electra task on a real binarized batch stream."""

import math
import pickle

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary, ListDataset

import electra_plugin  # noqa: F401  (registers the task)
from electra_plugin.cli import prepare
from electra_plugin.data.masking import ElectraMaskingDataset, max_predictions, word_starts
from electra_plugin.speed.switch import VARIABLE
from electra_plugin.tasks.electra_pretraining import (
    ElectraPretrainingConfig,
    ElectraPretrainingTask,
)
from helpers import (OBJECTS, SUBJECTS, TAILS, VERBS, failure, records, run_here, train_cmd,
                     write_corpus)


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


def test_an_epochs_order_is_the_same_loaded_at_the_start_or_at_a_resume(data_bin, task):
    """A run loads its split once, at epoch 1; a run resumed in epoch 3 loads it there. Both
    see epoch 3's batches in one order, and epoch 2's in another."""
    resumed = ElectraPretrainingTask.setup_task(task.cfg)
    resumed.load_dataset("train", epoch=3)

    def ids(t, epoch):
        return [b["id"].tolist() for b in batches(t, epoch=epoch)]

    assert ids(task, 3) == ids(resumed, 3)
    assert ids(task, 2) != ids(task, 3)


def test_loader_workers_give_the_batches_of_the_main_process(task):
    def stream(workers):
        itr = task.get_batch_iterator(task.dataset("train"), max_sentences=16, seed=7,
                                      epoch=1, num_workers=workers)
        return list(itr.next_epoch_itr(shuffle=True))

    alone, workers = stream(0), stream(2)
    assert len(alone) == len(workers) > 5
    for a, b in zip(alone, workers):
        assert torch.equal(a["id"], b["id"])
        assert torch.equal(a["target"], b["target"])
        for key in ("src_tokens", "src_lengths", "masked_positions", "has_padding"):
            assert torch.equal(torch.as_tensor(a["net_input"][key]),
                               torch.as_tensor(b["net_input"][key])), key


def test_dictionary_gets_mask_appended_like_sentence_prediction(data_bin, task):
    plain = Dictionary.load(str(data_bin / "dict.txt"))
    assert "<mask>" not in plain.indices
    # fairseq's sentence_prediction appends <mask> the same way: identical ids
    assert task.mask_idx == plain.add_symbol("<mask>") == len(plain) - 1
    assert len(task.dictionary) == len(plain)
    assert np.all([task.dictionary[i] == plain[i] for i in range(len(plain))])


# --------------------------------------------------------------------------- the collater
def toy_dictionary(words=60):
    d = Dictionary()
    for i in range(words):
        d.add_symbol(f"w{i}")
    d.add_symbol("<mask>")
    return d


def toy_items(d, count, seed, min_length=3, max_length=40):
    """Blocks as the task's dataset gives them: <s> first, ordinary tokens, a </s> or two."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(count):
        length = int(torch.randint(min_length, max_length + 1, (), generator=g))
        item = torch.randint(d.nspecial, len(d) - 1, (length,), generator=g)
        item[0] = d.bos()
        item[torch.rand(length, generator=g) < 0.05] = d.eos()
        items.append(item)
    return items


def toy_dataset(d, items, **options):
    dataset = ElectraMaskingDataset(ListDataset(items, np.array([len(i) for i in items])), d,
                                    d.index("<mask>"), seed=3, **options)
    dataset.set_epoch(1)
    return dataset


def collate(dataset, indices):
    return dataset.collater([dataset[i] for i in indices])


def rows_by_id(batches):
    """id -> (shown tokens, target), without padding."""
    rows = {}
    for b in batches:
        for i, n, src, tgt in zip(b["id"].tolist(), b["net_input"]["src_lengths"],
                                  b["net_input"]["src_tokens"], b["target"]):
            rows[i] = (src[:n], tgt[:n])
    return rows


def test_collated_batch_holds_the_masked_positions_and_whether_it_is_padded():
    d = toy_dictionary()
    items = toy_items(d, 9, seed=1) + [torch.tensor([d.bos(), d.eos()])]  # nothing to pick
    dataset = toy_dataset(d, items)
    batch = collate(dataset, range(len(items)))
    src, tgt, net = batch["net_input"]["src_tokens"], batch["target"], batch["net_input"]
    assert src.shape == tgt.shape == (10, max(len(i) for i in items))
    assert batch["id"].tolist() == list(range(10)) and batch["nsentences"] == 10
    assert net["src_lengths"].tolist() == [len(i) for i in items]
    assert batch["ntokens"] == sum(len(i) for i in items)
    # P slots a row by the official rule, the picked positions first (ascending), then
    # padding slots of weight 0 at a position the row did not pick
    slots = max_predictions(0.15, src.size(1))
    positions, weights = net["masked_positions"], net["masked_weights"]
    assert positions.dtype == torch.int64 and positions.shape == weights.shape == (10 * slots,)
    picked = tgt.ne(d.pad()).flatten()
    real = weights.bool()
    assert torch.equal(positions[real], picked.nonzero().squeeze(1))
    assert not picked[positions[~real]].any()
    assert torch.equal(positions.view(10, slots) // src.size(1), torch.arange(10)[:, None]
                       .expand(10, slots))
    assert batch["nmasked"] == int(picked.sum()) == int(weights.sum())
    assert net["has_padding"] is True
    # the original tokens, right-padded, are the input outside the picked positions
    for row, item in enumerate(items):
        original = torch.where(tgt[row].ne(d.pad()), tgt[row], src[row])
        assert torch.equal(original[:len(item)], item)
        assert original[len(item):].eq(d.pad()).all()
    assert tgt[-1].eq(d.pad()).all() and torch.equal(src[-1, :2], items[-1])
    full = collate(toy_dataset(d, toy_items(d, 4, seed=2, min_length=20, max_length=20)),
                   range(4))
    assert full["net_input"]["has_padding"] is False
    assert full["net_input"]["src_tokens"].ne(d.pad()).all()
    assert dataset.collater([]) == {}


@pytest.mark.parametrize("mask_prob", [0.15, 0.3])
def test_the_count_is_pythons_round_of_mask_prob_times_n(mask_prob):
    """Exactly max(1, round(mask_prob * n)) for every n up to 512 (in float32, 0.15 * 190
    rounds the other way)."""
    d = toy_dictionary()
    items = [torch.cat([torch.tensor([d.bos()]), torch.full((n,), d.index("w0"))])
             for n in range(1, 512)]
    dataset = toy_dataset(d, items, mask_prob=mask_prob)
    batch = collate(dataset, range(len(items)))
    counts = batch["target"].ne(d.pad()).sum(1)
    assert counts.tolist() == [max(1, round(mask_prob * n)) for n in range(1, 512)]


def test_max_predictions_is_the_official_rule():
    """int((mask_prob + 0.005) * T): official max_predictions_per_seq 19 at 128, 79 at 512."""
    assert [max_predictions(0.15, t) for t in (128, 512)] == [19, 79]
    assert max_predictions(0.25, 512) == int(0.255 * 512) == 130


@pytest.mark.parametrize("whole_words", [False, True])
def test_the_count_is_capped_at_the_official_slots(whole_words):
    """At 32 tokens P = int(0.155 * 32) = 4 while round(0.15 * 31) = 5: every row of 31
    candidates gets 4, as the official min(max_predictions_per_seq, round(...)); whole words
    never exceed it (a word longer than the cap is cut to its start)."""
    d = toy_dictionary()
    items = [torch.cat([torch.tensor([d.bos()]), torch.randint(d.nspecial, len(d) - 1, (31,),
                                                                generator=torch.Generator()
                                                                .manual_seed(i))])
             for i in range(20)]
    starts = np.ones(len(d), dtype=bool)
    starts[d.nspecial:d.nspecial + 30] = False  # most tokens continue a word: long words
    dataset = toy_dataset(d, items, word_starts=starts if whole_words else None)
    batch = collate(dataset, range(len(items)))
    assert max_predictions(0.15, 32) == 4 < round(0.15 * 31)
    counts = batch["target"].ne(d.pad()).sum(1)
    if whole_words:  # the greedy fill may leave room, never exceed it
        assert counts.max() == 4 and counts.min() >= 1
    else:
        assert counts.tolist() == [4] * 20
    assert torch.equal(batch["net_input"]["masked_weights"].view(20, 4).sum(1), counts.float())


def test_batches_come_in_a_few_lengths_outside_none_mode():
    """pad_to_multiple rounds a batch's length up (at most to max_length): a compiled step
    meets a few shapes; the padding is <pad>, never picked."""
    d = toy_dictionary()
    items = toy_items(d, 30, seed=5, max_length=40)
    dataset = toy_dataset(d, items, pad_to_multiple=16, max_length=44)
    lengths = set()
    for start in range(0, 30, 3):
        batch = collate(dataset, range(start, start + 3))
        src = batch["net_input"]["src_tokens"]
        longest = max(len(i) for i in items[start:start + 3])
        lengths.add(src.size(1))
        assert src.size(1) == min(-(-longest // 16) * 16, 44)
        assert src[:, longest:].eq(d.pad()).all()
    assert lengths <= {16, 32, 44}


def test_bert_rates_over_many_rows():
    d = toy_dictionary()
    mask = d.index("<mask>")
    dataset = toy_dataset(d, toy_items(d, 4000, seed=3), leave_unmasked_prob=0.1,
                          random_token_prob=0.1)
    special = torch.tensor([d.bos(), d.eos(), d.pad(), mask])
    picked = candidates = masked = kept = randomized = 0
    for start in range(0, len(dataset), 100):
        batch = collate(dataset, range(start, start + 100))
        src, tgt = batch["net_input"]["src_tokens"], batch["target"]
        is_picked = tgt.ne(d.pad())
        original = torch.where(is_picked, tgt, src)
        is_candidate = ~torch.isin(original, special)
        assert not (is_picked & ~is_candidate).any(), "a special token was picked"
        n = is_candidate.sum(1)
        assert torch.equal(is_picked.sum(1), torch.where(
            n > 0, torch.tensor([max(1, round(0.15 * int(k))) for k in n]), 0))
        assert torch.equal(src[~is_picked], original[~is_picked])
        shown, truth = src[is_picked], tgt[is_picked]
        other = shown.ne(mask) & shown.ne(truth)
        assert not torch.isin(shown[other], special).any()
        picked += int(is_picked.sum())
        candidates += int(is_candidate.sum())
        masked += int(shown.eq(mask).sum())
        kept += int(shown.eq(truth).sum())
        randomized += int(other.sum())
    assert picked > 10000
    assert abs(picked / candidates - 0.15) < 0.005
    # 80% <mask>, 10% unchanged (+ random draws of the original, 1/60 of 10%), 10% random;
    # binomial std over >10000 picks is < 0.004
    assert abs(masked / picked - 0.8) < 0.015
    assert abs(kept / picked - 0.1 - 0.1 / 60) < 0.012
    assert abs(randomized / picked - 0.1 * 59 / 60) < 0.012


@pytest.mark.parametrize("whole_words", [False, True])
def test_a_mask_depends_on_seed_epoch_and_index_only(whole_words, monkeypatch):
    d = toy_dictionary()
    items = toy_items(d, 60, seed=4)
    starts = np.arange(len(d)) % 3 != 1 if whole_words else None
    dataset = toy_dataset(d, items, word_starts=starts)
    reference = rows_by_id([collate(dataset, range(i, i + 8)) for i in range(0, 56, 8)])
    # other batches, in another order: other neighbours, another padded length
    order = np.random.default_rng(0).permutation(56)
    shuffled = [collate(dataset, order[i:i + 5]) for i in range(0, 55, 5)]
    # a loader worker gets a pickled copy; the speed switch must not matter
    worker = pickle.loads(pickle.dumps(dataset))
    monkeypatch.setenv(VARIABLE, "0")
    alone = [collate(worker, [i]) for i in range(55)]
    for batches in (shuffled, alone):
        for i, (src, tgt) in rows_by_id(batches).items():
            assert torch.equal(src, reference[i][0]) and torch.equal(tgt, reference[i][1]), i

    def picks(dataset, epoch):
        dataset.set_epoch(epoch)
        return rows_by_id([collate(dataset, range(56))])

    # another epoch or another seed: other masks
    other_seed = ElectraMaskingDataset(dataset.dataset, d, d.index("<mask>"), seed=4,
                                       word_starts=starts)
    for other in (picks(dataset, 2), picks(other_seed, 1)):
        same = sum(torch.equal(other[i][1], reference[i][1]) for i in range(56))
        assert same < 10, same


def test_whole_words_are_taken_greedily_in_random_order():
    """Per row: no word half picked, and the picked words are what the greedy rule leaves:
    at most the count, every other word too long for the room left; or, when every word is
    longer than the count, one word."""
    d = toy_dictionary()
    starts = np.arange(len(d)) % 3 != 1  # a third of the pieces continue a word
    dataset = toy_dataset(d, toy_items(d, 600, seed=5), word_starts=starts)
    special = torch.tensor([d.bos(), d.eos(), d.pad(), d.index("<mask>")])
    picked = candidates = long_words = 0
    for start in range(0, len(dataset), 100):
        batch = collate(dataset, range(start, start + 100))
        is_picked = batch["target"].ne(d.pad())
        original = torch.where(is_picked, batch["target"], batch["net_input"]["src_tokens"])
        for row, row_picked in zip(original.tolist(), is_picked.tolist()):
            words, previous = [], None
            for i, token in enumerate(row):
                if token in special:
                    continue
                if starts[token] or previous != i - 1:
                    words.append([])
                words[-1].append(i)
                previous = i
            count = max(1, round(0.15 * sum(map(len, words)))) if words else 0
            taken = [w for w in words if row_picked[w[0]]]
            assert all(all(row_picked[i] for i in w) for w in taken)
            assert not any(row_picked[i] for w in words if w not in taken for i in w)
            size = sum(map(len, taken))
            if size <= count:
                assert all(len(w) > count - size for w in words if w not in taken)
            else:
                assert len(taken) == 1 and all(len(w) > count for w in words)
            picked += size
            candidates += sum(map(len, words))
            long_words += sum(len(w) > 1 for w in taken)
    assert long_words > 300
    assert abs(picked / candidates - 0.15) < 0.01


# --------------------------------------------------------------------------- whole words
def wordpiece_vocab(words):
    """BERT-style vocab.txt rows: short words whole, longer ones as a 3-letter head and
    single-letter ``##`` pieces (1 to 10 pieces per word); "two" is left out (-> <unk>)."""
    rows = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."]
    for word in sorted(words - {"two"}):
        rows += [word] if len(word) <= 3 else [word[:3]] + [f"##{c}" for c in word[3:]]
    return list(dict.fromkeys(rows))


@pytest.fixture(scope="module")
def wordpiece_data(tmp_path_factory):
    """The test corpus through electra-prepare with a small WordPiece vocab."""
    root = tmp_path_factory.mktemp("wordpiece")
    write_corpus(root / "corpus.txt", 1200, seed=4)
    words = {w for phrase in SUBJECTS + VERBS + OBJECTS + TAILS for w in phrase.split()}
    (root / "vocab.txt").write_text("\n".join(wordpiece_vocab(words)) + "\n")
    prepare.main(["--train", str(root / "corpus.txt"), "--destdir", str(root / "bin"),
                  "--wordpiece-vocab", str(root / "vocab.txt"), "--workers", "1"])  # in process
    return root / "bin"


def words_of(symbols, is_candidate, wordpiece):
    """Lists of positions, one per word, read from the piece strings of one sample."""
    words = []
    for i, (symbol, ok) in enumerate(zip(symbols, is_candidate)):
        if not ok:
            continue
        begins = not symbol.startswith("##") if wordpiece else symbol.startswith("\u2581")
        if begins or not words or words[-1][-1] != i - 1:
            words.append([])
        words[-1].append(i)
    return words


def check_whole_words(task, batch_list, wordpiece):
    """-> (picked, candidates, picked words of several pieces) over the batches."""
    d = task.dictionary
    picked = candidates = long_words = 0
    for batch in batch_list:
        is_picked, is_candidate = picked_and_candidates(task, batch)
        assert not (is_picked & ~is_candidate).any(), "a special token was picked"
        original = torch.where(is_picked, batch["target"], batch["net_input"]["src_tokens"])
        for row, row_picked, row_cand in zip(original, is_picked, is_candidate):
            for word in words_of([d[i] for i in row], row_cand.tolist(), wordpiece):
                states = row_picked[word]
                assert states.all() or not states.any(), [d[int(row[i])] for i in word]
                long_words += int(states.all() and len(word) > 1)
        picked += int(is_picked.sum())
        candidates += int(is_candidate.sum())
    return picked, candidates, long_words


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sentencepiece", "wordpiece"])
def test_whole_word_masking_masks_words_entirely(kind, spm_data, wordpiece_data):
    data = spm_data if kind == "sentencepiece" else wordpiece_data
    task = make_task(data, whole_word_mask=True)
    assert task.dictionary.index("<unk>") == 3
    first = batches(task)
    picked, candidates, long_words = check_whole_words(task, first, kind == "wordpiece")
    assert picked > 1000 and long_words > 100, (picked, long_words)
    assert abs(picked / candidates - 0.15) < 0.005, picked / candidates
    # deterministic in (seed, epoch, index): a fresh task repeats the masks, epoch 2 does not
    for a, b in zip(first, batches(make_task(data, whole_word_mask=True))):
        assert torch.equal(a["net_input"]["src_tokens"], b["net_input"]["src_tokens"])
        assert torch.equal(a["target"], b["target"])
    second = {int(i): row for b in batches(task, epoch=2) for i, row in zip(b["id"], b["target"])}
    same = sum(torch.equal(row, second[int(i)]) for b in first
               for i, row in zip(b["id"], b["target"]))
    assert same < 0.1 * sum(len(b["id"]) for b in first)


@pytest.mark.slow
def test_whole_words_with_random_and_unchanged_tokens(wordpiece_data):
    task = make_task(wordpiece_data, whole_word_mask=True, mask_prob=0.3,
                     leave_unmasked_prob=0.1, random_token_prob=0.1)
    stream = batches(task)
    picked, candidates, _ = check_whole_words(task, stream, wordpiece=True)
    assert abs(picked / candidates - 0.3) < 0.005
    special = torch.tensor([0, 1, 2, task.mask_idx])
    masked = kept = randomized = 0
    for batch in stream:
        src, tgt = batch["net_input"]["src_tokens"], batch["target"]
        is_picked = tgt.ne(task.dictionary.pad())
        shown, original = src[is_picked], tgt[is_picked]
        masked += int(shown.eq(task.mask_idx).sum())
        kept += int(shown.eq(original).sum())
        other = shown.ne(task.mask_idx) & shown.ne(original)
        assert not torch.isin(shown[other], special).any()
        randomized += int(other.sum())
    # per piece 80% <mask>, 10% unchanged, 10% random (a random token equal to the original,
    # ~1/60 of them, counts as unchanged); binomial std over >2000 picks is ~0.007
    assert abs(masked / picked - 0.8) < 0.03
    assert abs(kept / picked - 0.1) < 0.025 and abs(randomized / picked - 0.1) < 0.025


def test_word_starts_follow_the_dictionary_convention(data_bin, spm_data, wordpiece_data):
    spm = Dictionary.load(str(spm_data / "dict.txt"))
    spm.add_symbol("##")  # a stray '##' piece does not make it WordPiece
    starts = word_starts(spm)
    assert all(starts[i] == spm[i].startswith("\u2581") for i in range(len(spm)))
    wp = Dictionary.load(str(wordpiece_data / "dict.txt"))
    starts = word_starts(wp)
    assert all(starts[i] != wp[i].startswith("##") for i in range(len(wp)))
    assert starts[wp.unk()]  # WordPiece's [UNK] stands for a whole word
    assert word_starts(Dictionary.load(str(data_bin / "dict.txt"))).all()  # words already


@pytest.mark.slow
def test_whole_word_mask_trains(spm_data, tmp_path):
    proc = run_here(train_cmd(spm_data, tmp_path, "--whole-word-mask", "--max-update", "3",
                              "--no-save", "--disable-validation"))
    assert proc.returncode == 0, failure("fairseq-train", proc)
    assert "whole-word masking: sentencepiece" in proc.stdout + proc.stderr
    logs = records(proc.stdout)
    assert len(logs) == 3 and all(math.isfinite(r["loss"]) for r in logs), logs
