"""SQuAD: offsets, windows and targets, official EM/F1, the loss, n-best prediction, a real
fairseq-train run of --task squad from a pre-training checkpoint, and one-line errors."""

import json
import math
import re
import sys
from argparse import Namespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fairseq.data import Dictionary

from electra_plugin.cli import squad as squad_cli
from electra_plugin.data import squad as sq
from electra_plugin.data import squad_answers as answers
from electra_plugin.data.tokenizer import WordPieceTextTokenizer, load_tokenizer
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import (
    LONG, PLUGIN, REPO, SHORT, answer, assert_main_error, assert_usage_error, run, run_here,
    squad_json, write_json,
)

SQUAD = [sys.executable, "-m", "electra_plugin.cli.squad"]  # electra-squad, installed or not


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    words = sorted(set((SHORT + " " + LONG).lower().replace(".", " ").split()))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "?"] + words + ["##s", "##e"]
    path = tmp_path_factory.mktemp("wp") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n")
    return WordPieceTextTokenizer(str(path), lowercase=True)


@pytest.fixture(scope="module")
def squad_bin(tmp_path_factory, spm_data):
    """SQuAD 2.0 and 1.1 preprocessed with the pre-training data's tokenizer, 64-token windows."""
    root = tmp_path_factory.mktemp("squad")
    out = {}
    for version in ("2.0", "1.1"):
        path = write_json(root / f"v{version}.json", squad_json(version))
        dest = root / f"bin{version}"
        assert squad_cli.main(["preprocess", "--pretrain-data", str(spm_data), "--train", str(path),
                            "--valid", str(path), "--destdir", str(dest), "--max-seq-len", "64",
                            "--doc-stride", "16", "--max-query-len", "16"]) == 0
        out[version] = dest
    return out


# --------------------------------------------------------------------------- tokenization
VARIED = [SHORT, LONG,
          "  Café déjà-vu:  naïve\tﬁnance ＦＵＬＬ İstanbul ΣΟΦΟΣ 3.14 [CLS] x ",
          "北京 emoji 😀 zero\u200bwidth end.", ""]


def test_offsets_give_back_the_text(tmp_path, spm_data, wordpiece):
    data = sq.read_squad(write_json(tmp_path / "t.json", squad_json()))
    for tok in (load_tokenizer(str(spm_data)), wordpiece):
        for text in VARIED:
            spans = tok.pieces_with_offsets(text)
            assert [p for p, _, _ in spans] == tok.pieces(text)
            starts = [s for _, s, _ in spans]
            assert starts == sorted(starts)
            for piece, s, e in spans:
                assert 0 <= s <= e <= len(text) and text[s:e] == text[s:e].strip()
                source = text[s:e].lower() if tok.lowercase else text[s:e]
                if piece != "<unk>" and s < e and source.isascii():
                    assert piece.lstrip("\u2581").removeprefix("##") == source
        # every answer maps back to exactly its text
        for ex in data.examples:
            context = data.contexts[ex.context]
            offsets = [(s, e) for _, s, e in tok.pieces_with_offsets(context)]
            for text, start in ex.answers:
                first, last = sq.answer_pieces(offsets, start, start + len(text))
                assert context[offsets[first][0]:offsets[last][1]] == text


# --------------------------------------------------------------------------- windows
def test_windows_and_targets(tmp_path, spm_data):
    tok = load_tokenizer(str(spm_data))
    dictionary = Dictionary.load(str(spm_data / "dict.txt"))
    data = sq.read_squad(write_json(tmp_path / "t.json", squad_json()))
    windows, offsets, stats = sq.make_windows(data, tok, dictionary, max_seq_len=64,
                                              doc_stride=16, max_query_len=16)
    for index, ex in enumerate(data.examples):
        mine = [w for w in windows if w.example == index]
        question = [dictionary.index(p) for p in tok.pieces(ex.question)][:16]
        doc = [dictionary.index(p) for p in tok.pieces(data.contexts[ex.context])]
        room = 64 - len(question) - 3
        # windows start every 16 pieces until one reaches the end of the context
        expected = [0]
        while expected[-1] + room < len(doc):
            expected.append(expected[-1] + 16)
        assert [w.doc_start for w in mine] == expected
        assert mine[-1].doc_start + mine[-1].doc_len == len(doc)
        for w in mine:
            assert len(w.tokens) <= 64 and w.doc_len == min(room, len(doc) - w.doc_start)
            assert w.tokens == [0] + question + [2] + doc[w.doc_start:w.doc_start + w.doc_len] + [2]
            assert w.seq_start == len(question) + 2
        if ex.is_impossible:
            assert all((w.start, w.end) == (0, 0) for w in mine)
            continue
        text, char_start = ex.answers[0]
        spans = offsets[ex.context]
        first, last = sq.answer_pieces(spans, char_start, char_start + len(text))
        inside = [w for w in mine if w.doc_start <= first and last < w.doc_start + w.doc_len]
        assert inside, ex.qid
        for w in mine:
            if w in inside:
                s, e = w.start, w.end
                assert w.tokens[s:e + 1] == doc[first:last + 1]
                c0 = spans[w.doc_start + s - w.seq_start][0]
                c1 = spans[w.doc_start + e - w.seq_start][1]
                assert data.contexts[ex.context][c0:c1] == text
            else:
                assert (w.start, w.end) == (0, 0)
    long = [w for w in windows if data.examples[w.example].qid == "q2"]
    assert len(long) >= 4
    assert long[0].start == 0 and any(w.start for w in long)  # not in the first window
    three = [w for w in windows if data.examples[w.example].qid == "q3"]
    assert three[0].start > 0 and three[-1].start == 0  # ... and this one outside the last
    assert stats["windows"] == len(windows)


def test_window_options_are_checked():
    with pytest.raises(ElectraUsageError, match="doc-stride"):
        sq.check_window_sizes(64, 50, 16)
    with pytest.raises(ElectraUsageError, match="no room"):
        sq.check_window_sizes(16, 1, 16)


# --------------------------------------------------------------------------- evaluation
def test_official_em_f1_by_hand():
    assert answers.normalize_answer("The  Cat's, an apple!") == "cats apple"
    examples = [
        sq.SquadExample("a", "?", 0, [("the green door", 0), ("green door", 4)]),
        sq.SquadExample("b", "?", 0, [("a red bird", 0)]),
        sq.SquadExample("c", "?", 0, [], is_impossible=True),
        sq.SquadExample("d", "?", 0, [], is_impossible=True),
        sq.SquadExample("e", "?", 0, [("two boxes", 0)]),
    ]
    preds = {"a": "Green door!", "b": "red bird near", "c": "", "d": "the ball"}  # e missing
    # a: EM 1, F1 1. b: gold "red bird" (article dropped) vs "red bird near": P 2/3, R 1,
    # F1 0.8. c: "" = "" -> 1, 1. d: 0, 0. e: no prediction -> 0, 0.
    result = answers.squad_scores(examples, preds)
    assert result["exact"] == pytest.approx(100 * 2 / 5)
    assert result["f1"] == pytest.approx(100 * (1 + 0.8 + 1) / 5)
    assert result["HasAns_exact"] == pytest.approx(100 / 3)
    assert result["HasAns_f1"] == pytest.approx(100 * 1.8 / 3)
    assert result["NoAns_exact"] == result["NoAns_f1"] == pytest.approx(50)
    assert answers.f1_score("green", "the green door") == pytest.approx(2 * 1 * 0.5 / 1.5)

    # Best threshold (official v2.0 find_best_thresh): questions whose null score is at most
    # the threshold get their best span. Null scores order them c(-3) a(-1) e(0) d(2) b(5);
    # EM counts: all empty 2 (c, d), +c's span "x" 1, +a 2, +e 3, +d 2, +b 2: best 3 at 0.
    spans = {"a": "green door", "b": "wrong", "c": "x", "d": "the ball", "e": "two boxes"}
    nulls = {"a": -1.0, "b": 5.0, "c": -3.0, "d": 2.0, "e": 0.0}
    result = answers.squad_scores(examples, preds, nulls, spans)
    assert result["best_exact"] == pytest.approx(60) and result["best_exact_thresh"] == 0.0


def test_joint_head_by_hand():
    """The official joint head: start logits kept to the context (-1000 elsewhere), end
    logits from GELU([start features, token features]) for the gold start in training and
    for the beam of likely starts otherwise; the answerable logit reads [first token,
    features averaged under the start probabilities]."""
    from electra_plugin.models.core.span_head import JOINT_HIDDEN, SpanHead, answer_context

    torch.manual_seed(0)
    head = SpanHead(2, answerable=True, dropout=0.0, joint_prediction=True, beam_size=2,
                    answerable_uses_start_logits=True).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.zero_()
        head.out_proj.weight[0] = torch.tensor([1.0, 0.0])  # start logit: feature 0
        head.end_dense.weight[0] = torch.tensor([1.0, 0.0, 0.0, 1.0])  # h_s[0] + h_t[1]
        head.end_proj.weight[0, 0] = 2.0
        head.no_answer_dense.weight[0] = torch.tensor([0.0, 1.0, 1.0, 0.0])  # h_0[1] + avg[0]
        head.no_answer_proj.weight[0, 0] = 1.0
    assert head.end_dense.out_features == head.no_answer_dense.out_features == JOINT_HIDDEN
    h = torch.tensor([[[0.5, 1.0], [2.0, -1.0], [1.0, 3.0], [3.0, 0.0]]])  # <s> q c c
    types, padding = torch.tensor([[0, 0, 1, 1]]), torch.zeros(1, 4, dtype=torch.bool)
    context = answer_context(types, padding)
    assert context.tolist() == [[True, False, True, True]]
    gelu = lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    out = head(h, padding, types, torch.tensor([2]))  # teacher forcing at the gold start 2
    assert out.start[0].tolist() == pytest.approx([0.5, 2.0 - 1000, 1.0, 3.0])
    expected = [2 * gelu(1.0 + h[0, t, 1].item()) - (0 if context[0, t] else 1000)
                for t in range(4)]
    assert out.end[0].tolist() == pytest.approx(expected, abs=1e-4)
    p = torch.tensor([0.5, -1000.0, 1.0, 3.0]).softmax(-1)
    average = (p[:, None] * h[0]).sum(0)
    assert out.no_answer.item() == pytest.approx(gelu(1.0 + average[0].item()), abs=1e-5)
    beam = head(h, padding, types)  # inference: the two likeliest starts, 3 then 2
    assert beam.start_top.tolist() == [[3, 2]] and beam.end.shape == (1, 2, 4)
    for row, s in enumerate((3, 2)):
        assert beam.end[0, row].tolist() == pytest.approx(
            [2 * gelu(h[0, s, 0].item() + h[0, t, 1].item()) -
             (0 if context[0, t] else 1000) for t in range(4)], abs=1e-4)


def test_joint_decoding_by_hand():
    """Joint windows give their own pairs: each beam start with its K best ends given it,
    scored log p(start) + log p(end | start)."""
    context = "aa bb cc"
    offsets = [0, 2, 3, 5, 6, 8]
    ex = sq.SquadExample("q", "?", 0, [("bb", 3)])
    meta = sq.SquadMetadata("1.1", 8, 1, 1, [context], [offsets], [ex], [(0, 0, 3, 2)])
    start = np.array([0.0, -1000, 1.0, 2.0, 0.5, -1000])  # <s> q aa bb cc </s>
    ends = np.array([[-1000, -1000, 0.0, 0.0, 3.0, -1000],  # given start bb (index 3)
                     [-1000, -1000, 1.0, 2.0, 0.0, -1000]])  # given start aa (index 2)
    logits = {0: answers.WindowLogits(start, ends, None, np.array([3, 2]))}
    pred = answers.predict_answers(meta, logits)["q"]

    def log_softmax(x):
        return x - np.log(np.exp(x - x.max()).sum()) - x.max()

    ls, le = log_softmax(start), [log_softmax(row) for row in ends]
    scores = {c["text"]: c["score"] for c in pred.nbest}
    assert pred.answer == "bb cc"
    assert scores["bb cc"] == pytest.approx(ls[3] + le[0][4])
    assert scores["aa bb"] == pytest.approx(ls[2] + le[1][3])
    assert scores["aa"] == pytest.approx(ls[2] + le[1][2])
    # bb's two best ends are cc and aa (before it: dropped); cc is no beam start
    assert set(scores) == {"bb cc", "aa bb", "aa"}


def test_predict_answers_from_hand_made_logits():
    context = "aa bb cc dd ee"
    offsets = [0, 2, 3, 5, 6, 8, 9, 11, 12, 14]  # five pieces p0..p4, one per word
    ex = sq.SquadExample("q", "?", 0, [("cc", 6)])
    # two windows <s> q </s> p0 p1 p2 </s> and <s> q </s> p2 p3 p4 </s>; p2 is at the edge
    # of both, and the tie goes to the first window (BERT's max-context rule)
    meta = sq.SquadMetadata("2.0", 8, 1, 1, [context], [offsets], [ex],
                            [(0, 0, 3, 2), (0, 2, 3, 2)])
    low = -10.0
    start0, end0 = [0, low, 0.5, 2, 9, low], [0, low, low, low, 8, low]
    start1, end1 = [0, low, 5, low, 2, low], [0, low, 1, 0, 7, low]
    logits = {0: answers.WindowLogits(np.array(start0), np.array(end0), -1.0),
              1: answers.WindowLogits(np.array(start1), np.array(end1), 2.0)}

    def nbest(**kw):
        pred = answers.predict_answers(meta, logits, **kw)["q"]
        return pred, [(c["text"], c["score"]) for c in pred.nbest]

    # window 0: cc 9+8, bb..cc 2+8, aa..cc 0.5+8 (3 pieces), bb 2-10, aa 0.5-10, aa..bb;
    # window 1: ee 2+7, dd..ee -10+7, dd -10+0; "cc dd ee" (5+7) would need a start at p2
    # in window 1, which is not its max-context window.
    pred, best = nbest(n_best_size=20, max_answer_len=2)
    assert best[:4] == [("cc", 17), ("bb cc", 10), ("ee", 9), ("dd ee", -3)]
    assert pred.answer == pred.best_span == "cc" and pred.no_answer_score == -1.0
    assert sum(c["probability"] for c in pred.nbest) == pytest.approx(1.0)
    assert pred.nbest[0]["probability"] == pytest.approx(
        1 / sum(math.exp(score - 17) for _, score in best))
    _, best = nbest(n_best_size=20, max_answer_len=3)
    assert ("aa bb cc", 8.5) in best and "cc dd ee" not in dict(best)
    _, best = nbest(n_best_size=3, max_answer_len=1)
    assert best == [("cc", 17), ("ee", 9), ("bb", -8)]
    # SQuAD 2.0: "" once the smallest no-answer logit (-1) is above the threshold
    pred, _ = nbest(no_answer_threshold=-2.0)
    assert pred.answer == "" and pred.best_span == "cc"


# --------------------------------------------------------------------------- task + loss
def test_task_batch_and_loss_by_hand(squad_bin):
    from electra_plugin.criterions.squad import SquadCriterion
    from electra_plugin.tasks.squad import SquadConfig, SquadTask

    for version, answerable in (("2.0", True), ("1.1", False)):
        # the directory carries the pre-training dictionary and tokenizer
        assert load_tokenizer(str(squad_bin[version])).pieces(SHORT)
        task = SquadTask.setup_task(SquadConfig(data=str(squad_bin[version]), seed=1))
        assert task.version == version and task.max_positions() == 64
        model = tiny_squad_model(task)
        assert model.generator is None  # discriminator only outside the electra task
        assert list(model.classification_heads) == ["squad"]
        assert model.classification_heads["squad"].out_proj.weight.shape == (2, 16)
        dataset = task.load_dataset("train")
        meta = task.load_metadata("train")
        sample = dataset.collater([dataset[i] for i in range(len(dataset))])
        ids = sample["id"].tolist()
        targets = sample["target"].tolist()
        tokens = sample["net_input"]["src_tokens"]
        for row, w in enumerate(ids):  # targets and segments follow the metadata
            example, _, doc_len, seq_start = meta.windows[w]
            types = sample["net_input"]["token_types"][row]
            assert types[:seq_start].eq(0).all()
            assert types[seq_start:seq_start + doc_len + 1].eq(1).all()
            assert tokens[row, seq_start - 1] == 2 and tokens[row, seq_start + doc_len] == 2
        assert sum(t == [0, 0] for t in targets) > 0 and sum(t != [0, 0] for t in targets) > 0

        criterion = SquadCriterion(task, no_answer_weight=0.5)
        loss, sample_size, log = criterion(model, sample)
        out, _ = model(**sample["net_input"], classification_head_name="squad")
        assert (out.no_answer is not None) == answerable
        expected = 0.0
        for row, (s, e) in enumerate(targets):
            n = int(tokens[row].ne(1).sum())
            expected += (-F.log_softmax(out.start[row, :n], -1)[s]
                         - F.log_softmax(out.end[row, :n], -1)[e]) / 2
            if answerable:
                p = torch.sigmoid(out.no_answer[row])
                expected += 0.5 * -torch.log(p if s == 0 else 1 - p)
        assert sample_size == len(ids)
        assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-4)


def tiny_squad_model(task):
    args = Namespace(arch="electra_tiny", num_layers=1, hidden_size=16, num_heads=2,
                     ffn_size=32, embedding_size=8, generator_size=0.5, _name="electra")
    torch.manual_seed(0)  # the same model whatever ran before in the process
    return task.build_model(args).eval()


def hand_built_batch(task, model):
    """Four windows of lengths 9, 6, 4, 7 (padded to 9), targets chosen against the model's
    own outputs: start and end right, start right and end wrong, and two without an answer
    (target 0); -> (sample, span logits)."""
    pad = task.source_dictionary.pad()
    lengths = [9, 6, 4, 7]
    g = torch.Generator().manual_seed(3)
    tokens = torch.full((4, 9), pad)
    types = torch.zeros(4, 9, dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.randint(4, 40, (n,), generator=g)
        tokens[row, 0], tokens[row, 3], tokens[row, n - 1] = 0, 2, 2  # <s> q </s> c </s>
        types[row, 4:n] = 1
    net_input = {"src_tokens": tokens, "token_types": types,
                 "src_lengths": torch.tensor(lengths)}
    with torch.no_grad():
        out, _ = model(**net_input, classification_head_name="squad")
    best = [(int(out.start[r, :n].argmax()), int(out.end[r, :n].argmax()))
            for r, n in enumerate(lengths)]
    targets = [best[0], (best[1][0], (best[1][1] + 1) % lengths[1]), (0, 0), (0, 0)]
    sample = {"id": torch.arange(4), "net_input": net_input, "target": torch.tensor(targets),
              "ntokens": sum(lengths), "nsentences": 4}
    return sample, out


def straightforward_logs(out, sample, no_answer_weight):
    """The criterion's sums, window by window with Python numbers."""
    ref = dict.fromkeys(("loss", "start_loss", "end_loss", "no_answer_loss"), 0.0)
    ref.update(dict.fromkeys(("no_answer_windows", "start_correct", "end_correct",
                              "no_answer_correct"), 0))
    for row, (s, e) in enumerate(sample["target"].tolist()):
        n = sample["net_input"]["src_lengths"][row].item()
        start, end = out.start[row, :n].double(), out.end[row, :n].double()
        start_loss = -F.log_softmax(start, -1)[s].item()
        end_loss = -F.log_softmax(end, -1)[e].item()
        unanswerable = s == 0
        p = torch.sigmoid(out.no_answer[row].double()).item()
        no_answer_loss = -math.log(p if unanswerable else 1 - p)
        ref["start_loss"] += start_loss
        ref["end_loss"] += end_loss
        ref["no_answer_loss"] += no_answer_loss
        ref["loss"] += (start_loss + end_loss) / 2 + no_answer_weight * no_answer_loss
        ref["no_answer_windows"] += unanswerable
        ref["start_correct"] += start.argmax().item() == s
        ref["end_correct"] += end.argmax().item() == e
        ref["no_answer_correct"] += (out.no_answer[row].item() > 0) == unanswerable
    return ref


def test_loss_and_logged_values_against_a_straightforward_computation(squad_bin):
    from fairseq import metrics

    from electra_plugin.criterions.squad import SquadCriterion
    from electra_plugin.tasks.squad import SquadConfig, SquadTask

    task = SquadTask.setup_task(SquadConfig(data=str(squad_bin["2.0"]), seed=1))
    model = tiny_squad_model(task)
    sample, out = hand_built_batch(task, model)
    ref = straightforward_logs(out, sample, no_answer_weight=0.3)
    # the targets make the counts neither 0 nor all windows
    assert all(0 < ref[k] < 4 for k in ("start_correct", "end_correct", "no_answer_windows"))

    loss, sample_size, log = SquadCriterion(task, no_answer_weight=0.3)(model, sample)
    assert sample_size == log["sample_size"] == log["windows"] == 4
    assert float(loss.detach()) == pytest.approx(ref["loss"], rel=1e-5)
    for key, value in ref.items():
        if isinstance(value, int):
            assert int(log[key]) == value, key
        else:
            assert float(log[key]) == pytest.approx(value, rel=1e-5), key

    with metrics.aggregate() as agg:
        SquadCriterion.reduce_metrics([log, log])  # two micro-batches: the sums double
        logged = {k: float(v) for k, v in agg.get_smoothed_values().items()}
    # what the Python-float arithmetic gives, to the last bit: per window, rounded
    for key in ("loss", "start_loss", "end_loss", "no_answer_loss"):
        assert logged[key] == round(float(2 * log[key]) / 8, 3), key
    for name, key, denominator in (("start_acc", "start_correct", 4),
                                   ("end_acc", "end_correct", 4),
                                   ("no_answer_acc", "no_answer_correct", 4)):
        assert logged[name] == round(100 * 2 * ref[key] / (2 * denominator), 2), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_criterion_waits_for_nothing_on_the_gpu(squad_bin):
    """From the span head's output to the logged meters, no host-device sync (any raises
    under sync debug mode "error"); loss and logs as on the CPU."""
    from fairseq import metrics, utils

    from electra_plugin.criterions.squad import SquadCriterion
    from electra_plugin.tasks.squad import SquadConfig, SquadTask

    task = SquadTask.setup_task(SquadConfig(data=str(squad_bin["2.0"]), seed=1))
    model = tiny_squad_model(task)
    sample, _ = hand_built_batch(task, model)
    criterion = SquadCriterion(task, no_answer_weight=0.5)
    _, _, cpu_log = criterion(model, sample)
    model.cuda()
    sample = utils.move_to_cuda(sample)
    torch.cuda.synchronize()
    hook = model.classification_heads["squad"].register_forward_hook(
        lambda *_: torch.cuda.set_sync_debug_mode("error"))  # after the encoder's own sync
    try:
        loss, _, log = criterion(model, sample)
        # a root of its own: earlier tests of this process left CPU meters in fairseq's
        with metrics.aggregate(new_root=True) as agg:  # global one, moved here (a sync)
            SquadCriterion.reduce_metrics([log])
            torch.cuda.set_sync_debug_mode("default")
            logged = agg.get_smoothed_values()  # (fairseq's .item() on every meter)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        hook.remove()
    assert loss.is_cuda and logged["loss"] == pytest.approx(float(cpu_log["loss"]) / 4, abs=2e-3)
    for key, value in cpu_log.items():
        if torch.is_tensor(value) and value.is_floating_point():
            assert float(log[key]) == pytest.approx(float(value), rel=1e-4), key
        else:
            assert int(log[key]) == int(value), key


# --------------------------------------------------------------------------- end to end
def finetune_cmd(data, save_dir, pretrained, *extra):
    return [sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN,
            "--task", "squad", "--criterion", "squad", "--arch", "electra_tiny", "--cpu",
            "--restore-file", pretrained, "--reset-optimizer", "--reset-dataloader",
            "--reset-meters", "--batch-size", "8", "--num-workers", "0",
            "--optimizer", "electra_adam", "--layer-decay", "0.8", "--lr", "1e-3",
            "--lr-scheduler", "polynomial_decay", "--warmup-updates", "1",
            "--total-num-update", "3", "--max-update", "3", "--save-dir", save_dir,
            "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "1",
            "--no-progress-bar", "--seed", "1", *extra]


def test_bad_input_to_preprocess_and_finetune(tmp_path, squad_bin):
    """electra-squad preprocess's main and fairseq-train's, in process: one line each."""
    bad = tmp_path / "bad"
    bad.mkdir()
    missing = squad_json()
    del missing["data"][0]["paragraphs"][1]["qas"][0]["question"]
    shifted = squad_json()
    shifted["data"][0]["paragraphs"][1]["qas"][1]["answers"][0]["answer_start"] += 1
    for name, obj, phrases in (
            ("missing", missing, ["paragraphs[1].qas[0] has no 'question' field"]),
            ("shifted", shifted, ["do not match the context at answer_start", "'q3'",
                                  "--realign-answers"])):
        path = write_json(bad / f"{name}.json", obj)
        assert_main_error(squad_cli.main, ["preprocess", "--pretrain-data", squad_bin["2.0"],
                                           "--train", path, "--destdir", bad / name], *phrases)
        assert not (bad / name).exists()
    # the model is refused when the task builds it, before the --restore-file is read
    assert_usage_error(finetune_cmd(squad_bin["2.0"], tmp_path / "ck0", tmp_path / "unread.pt",
                                    "--max-positions", "32"), "up to 64 tokens", "32 positions")
    assert not list((tmp_path / "ck0").glob("*.pt"))


@pytest.mark.slow
def test_finetune_then_predict(tmp_path, squad_bin, pretrained, capsys):
    save = tmp_path / "ck"
    proc = run_here(finetune_cmd(squad_bin["2.0"], save, pretrained))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(m.group(1)) for m in re.finditer(
        r"\| (?:train_inner|train|valid) \| (\{.*\})$", proc.stdout, re.M)]
    train = [r for r in records if "loss" in r]
    assert len(train) == 3 and all(math.isfinite(float(r["loss"])) for r in train)
    assert all("no_answer_acc" in r and "start_acc" in r for r in train)
    assert any("valid_loss" in r for r in records)
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    keys = list(state["model"])
    assert not any(k.startswith(("generator", "discriminator_head")) for k in keys)
    assert "classification_heads.squad.out_proj.weight" in keys
    assert "classification_heads.squad.no_answer_proj.weight" in keys

    out = tmp_path / "pred"
    proc = run([*SQUAD, "predict", "--checkpoint", save / "checkpoint_last.pt",
                "--data", squad_bin["2.0"], "--split", "valid", "--out-dir", out, "--cpu",
                "--json"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    predictions = json.loads((out / "predictions.json").read_text())
    assert sorted(predictions) == ["q1", "q2", "q3", "q4", "q5"]
    contexts = {"q1": SHORT, "q4": SHORT}
    for qid, text in predictions.items():
        assert text in contexts.get(qid, LONG)  # a span of the original context (or "")
    scores = json.loads(proc.stdout.strip().splitlines()[-1])
    assert scores == json.loads((out / "eval.json").read_text())
    assert scores["total"] == 5 and 0 <= scores["f1"] <= 100 and "best_f1" in scores
    assert sorted(json.loads((out / "null_odds.json").read_text())) == sorted(predictions)
    # the stand-alone evaluation of predictions.json agrees
    gold = write_json(tmp_path / "gold.json", squad_json())
    assert squad_cli.main(["evaluate", str(gold), str(out / "predictions.json"), "--json"]) == 0
    standalone = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert standalone["exact"] == scores["exact"] and standalone["f1"] == scores["f1"]

    # a test set without gold answers: predicted with the no-answer threshold, not scored
    unlabelled = squad_json()
    for article in unlabelled["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                del qa["answers"]
                qa.pop("is_impossible", None)
                qa.pop("plausible_answers", None)
    test_data = tmp_path / "test-bin"
    assert squad_cli.main(["preprocess", "--pretrain-data", str(squad_bin["2.0"]), "--valid",
                           str(write_json(tmp_path / "v.json", squad_json())), "--test",
                           str(write_json(tmp_path / "t.json", unlabelled)), "--destdir",
                           str(test_data), "--max-seq-len", "64", "--doc-stride", "16",
                           "--max-query-len", "16"]) == 0
    odds = None
    for threshold, out in (("1e9", tmp_path / "answer-all"), ("-1e9", tmp_path / "answer-none")):
        assert squad_cli.main(["predict", "--checkpoint", str(save / "checkpoint_last.pt"),
                               "--data", str(test_data), "--split", "test", "--out-dir",
                               str(out), f"--no-answer-threshold={threshold}", "--cpu"]) == 0
        predicted = json.loads((out / "predictions.json").read_text())
        assert sorted(predicted) == ["q1", "q2", "q3", "q4", "q5"]
        assert not (out / "eval.json").exists()  # nothing to score against
        odds = odds or json.loads((out / "null_odds.json").read_text())
        assert json.loads((out / "null_odds.json").read_text()) == odds
        # above the threshold a question gets "": a threshold above every score answers all
        assert all(a for a in predicted.values()) if threshold == "1e9" else \
            not any(predicted.values())


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_predict_on_the_gpu_matches_the_cpu(tmp_path, squad_bin, pretrained):
    save = tmp_path / "ck"
    proc = run_here(finetune_cmd(squad_bin["2.0"], save, pretrained, "--disable-validation"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = {}
    for device, flags in (("cuda", []), ("cpu", ["--cpu"])):  # the GPU unless --cpu
        out = tmp_path / device
        proc = run([*SQUAD, "predict", "--checkpoint", save / "checkpoint_last.pt", "--data",
                    squad_bin["2.0"], "--out-dir", out, "--batch-size", "3", *flags])
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"questions ({device})" in proc.stderr, proc.stderr[-2000:]
        outputs[device] = {name: json.loads((out / f"{name}.json").read_text())
                           for name in ("predictions", "null_odds", "nbest_predictions")}
    gpu, cpu = outputs["cuda"], outputs["cpu"]
    assert gpu["predictions"] == cpu["predictions"]
    assert gpu["null_odds"] == pytest.approx(cpu["null_odds"], abs=1e-4)
    for qid, nbest in cpu["nbest_predictions"].items():
        assert [e["text"] for e in gpu["nbest_predictions"][qid]] == [e["text"] for e in nbest]
        assert [e["score"] for e in gpu["nbest_predictions"][qid]] == \
            pytest.approx([e["score"] for e in nbest], abs=1e-4)


def test_bad_json_in_process(tmp_path):
    """Each bad input is one ElectraUsageError line; --realign-answers fixes shifted starts."""
    obj = squad_json()
    obj["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] -= 2
    path = write_json(tmp_path / "shifted.json", obj)
    with pytest.raises(ElectraUsageError) as err:
        sq.read_squad(path)
    assert "\n" not in str(err.value) and "'q1'" in str(err.value)
    data = sq.read_squad(path, realign=True)
    assert data.realigned == 1
    assert data.examples[0].answers[0] == ("a house", SHORT.index("a house"))
    obj["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["text"] = "a castle"
    with pytest.raises(ElectraUsageError, match="nowhere in the context"):
        sq.read_squad(write_json(path, obj), realign=True)
    for breaker, phrase in (
            (lambda o: o.pop("data"), "no 'data' field"),
            (lambda o: o["data"][0]["paragraphs"][0].pop("context"), "no 'context' field"),
            (lambda o: o["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].pop(
                "answer_start"), "no 'answer_start' field"),
            (lambda o: o["data"][0]["paragraphs"][0]["qas"][0].update(id="q2"), "occurs twice"),
            (lambda o: o["data"][0]["paragraphs"][0]["qas"][1].update(is_impossible=False),
             "has no answers")):
        obj = squad_json()
        breaker(obj)
        with pytest.raises(ElectraUsageError, match=phrase) as err:
            sq.read_squad(write_json(path, obj))
        assert "\n" not in str(err.value)
    with pytest.raises(ElectraUsageError, match="SQuAD 1.1 has not"):
        sq.read_squad(write_json(path, squad_json("2.0")), version="1.1")


# --------------------------------------------------------------------------- commands
# the SQuAD files of bigbench's squad_shifts task, all that scripts/fetch_squad.py keeps
SHIFTS_FILES = ("new_wiki_v1.0.json", "nyt_v1.0.json", "reddit_v1.0.json",
                "amazon_reviews_v1.0.json", "squaddev_v1.1.json")


@pytest.mark.slow
def test_fetch_from_sdist_and_split(tmp_path):
    """scripts/fetch_squad.py takes only the squad_shifts SQuAD files out of the bigbench
    sdist and caches them; split holds out whole paragraphs."""
    import tarfile

    src = tmp_path / "src"
    inner = src / "bigbench-1.0.0" / "bigbench" / "benchmark_tasks" / "squad_shifts"
    inner.mkdir(parents=True)
    for name in SHIFTS_FILES + ("new_wiki_v1.0_removed.json", "task.py"):
        write_json(inner / name, squad_json("1.1") if name in SHIFTS_FILES else {})
    sdist = tmp_path / "bigbench-1.0.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src / "bigbench-1.0.0", arcname="bigbench-1.0.0")
    cache = tmp_path / "cache"
    fetch = [sys.executable, REPO / "scripts" / "fetch_squad.py", "--cache-dir", cache,
             "--sdist", sdist]
    first = run(fetch)
    assert first.returncode == 0, first.stderr[-3000:]
    assert sorted(p.name for p in cache.iterdir()) == sorted(SHIFTS_FILES + ("SOURCE.json",))
    sdist.unlink()  # cached: not needed again
    again = run(fetch)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (first.stdout + again.stdout).split() == [str(cache)] * 2

    big = squad_json("1.1")
    paragraphs = big["data"][0]["paragraphs"]
    for k in range(6):  # more paragraphs, each with its own question ids
        paragraphs.append({"context": SHORT, "qas": [
            {"id": f"x{k}", "question": "?", "answers": [answer("a dog", SHORT)]}]})
    out = tmp_path / "split"
    assert squad_cli.main(["split", str(write_json(tmp_path / "big.json", big)), "--out-dir",
                        str(out), "--valid-fraction", "0.3", "--seed", "3"]) == 0
    train, valid = (sq.read_squad(str(out / f"{part}.json")) for part in ("train", "valid"))
    ids = lambda d: {e.qid for e in d.examples}  # noqa: E731
    everything = sq.read_squad(str(tmp_path / "big.json")).examples
    assert ids(train) | ids(valid) == {e.qid for e in everything}
    assert not ids(train) & ids(valid) and len(ids(valid)) >= 3
    # questions about one paragraph stay together
    assert {"q2", "q3", "q5"} <= ids(train) or {"q2", "q3", "q5"} <= ids(valid)


@pytest.mark.slow
def test_squad_11_head_served_by_transformers_and_back(tmp_path, squad_bin, pretrained):
    """A SQuAD 1.1 checkpoint -> ElectraForQuestionAnswering: transformers' logits equal the
    plugin's within 1e-5 and give the same answers through the official decoding
    (transformers 5 has no question-answering pipeline any more); its import gives the
    fine-tuned weights back bit for bit, predicts the same answers, and exports the same
    tensors again. A SQuAD 2.0 head is refused in one line naming its no-answer classifier."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from electra_plugin.cli import convert
    from electra_plugin.data.evaluation import squad_window_logits
    from electra_plugin.finetuning.evaluate import load_finetuned, squad_predictions

    data = squad_bin["1.1"]
    proc = run_here(finetune_cmd(data, tmp_path / "ck", pretrained))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ck = tmp_path / "ck" / "checkpoint_last.pt"
    convert.main(["export", str(ck), "--out", str(tmp_path / "hf")])
    hf = transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "ElectraForQuestionAnswering"

    model, task = load_finetuned(str(ck), str(data), "squad")
    dataset = task.load_dataset("valid")
    ours = squad_window_logits(model, task, dataset, 8, torch.device("cpu"))
    theirs, largest = {}, 0.0
    batches = task.get_batch_iterator(dataset=dataset, max_sentences=8,
                                      ignore_invalid_inputs=False).next_epoch_itr(shuffle=False)
    with torch.no_grad():
        for sample in batches:
            net = sample["net_input"]
            tokens = net["src_tokens"]
            out = hf(input_ids=tokens, token_type_ids=net["token_types"],
                     attention_mask=tokens.ne(task.dictionary.pad()).long())
            for b, window in enumerate(sample["id"].tolist()):
                n = int(net["src_lengths"][b])
                theirs[window] = answers.WindowLogits(out.start_logits[b, :n].numpy(),
                                                      out.end_logits[b, :n].numpy())
                for mine, hers in ((ours[window].start, theirs[window].start),
                                   (ours[window].end, theirs[window].end)):
                    largest = max(largest, float(np.abs(mine - hers).max()))
    assert sorted(theirs) == sorted(ours) and largest < 1e-5, largest
    print(f"ElectraForQuestionAnswering: largest start/end logit difference {largest:.1e}")
    meta = task.load_metadata("valid")
    predicted, _ = squad_predictions(str(ck), str(data), "valid", cpu=True)
    decoded = answers.predict_answers(meta, theirs)
    assert {q: p.answer for q, p in decoded.items()} == {q: p.answer for q, p in predicted.items()}

    convert.main(["import", "--discriminator", str(tmp_path / "hf"),
                  "--out", str(tmp_path / "imported")])
    imported = tmp_path / "imported" / "checkpoint.pt"
    original = torch.load(ck, map_location="cpu", weights_only=True)["model"]
    back = torch.load(imported, map_location="cpu", weights_only=True)["model"]
    assert sorted(back) == sorted(original)
    assert all(torch.equal(back[k], original[k]) for k in original)
    again, _ = squad_predictions(str(imported), str(data), "valid", cpu=True)
    assert {q: p.answer for q, p in again.items()} == {q: p.answer for q, p in predicted.items()}
    proc = run_here(finetune_cmd(data, tmp_path / "further", imported))  # and fine-tunes further
    assert proc.returncode == 0, proc.stderr[-3000:]
    convert.main(["export", str(imported), "--out", str(tmp_path / "hf2")])
    first, second = (load_file(tmp_path / d / "model.safetensors") for d in ("hf", "hf2"))
    assert sorted(first) == sorted(second)
    assert all(torch.equal(first[k], second[k]) for k in first)

    proc = run_here(finetune_cmd(squad_bin["2.0"], tmp_path / "ck2", pretrained))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_main_error(convert.main, ["export", tmp_path / "ck2" / "checkpoint_last.pt", "--out",
                                     tmp_path / "hf3"],
                      "no_answer_dense", "ElectraForQuestionAnswering has no slot for")


@pytest.mark.slow
def test_official_joint_decoding_trains_and_predicts(tmp_path, squad_bin, pretrained):
    """--joint-prediction --answerable-uses-start-logits --beam-size: a real few-update run
    whose checkpoint holds the joint layers, predicts spans of the context through the beam,
    and is refused by the HF export in one line naming them."""
    from electra_plugin.cli import convert
    from electra_plugin.finetuning.evaluate import squad_predictions

    save = tmp_path / "ck"
    proc = run_here(finetune_cmd(squad_bin["2.0"], save, pretrained, "--joint-prediction",
                                 "--answerable-uses-start-logits", "--beam-size", "4"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = [json.loads(m.group(1)) for m in re.finditer(
        r"\| train_inner \| (\{.*\})$", proc.stdout, re.M)]
    assert len(train) == 3 and all(math.isfinite(float(r["end_loss"])) for r in train)
    ck = save / "checkpoint_last.pt"
    weights = torch.load(ck, map_location="cpu", weights_only=True)["model"]
    assert weights["classification_heads.squad.end_dense.weight"].shape[0] == 512
    assert weights["classification_heads.squad.out_proj.weight"].shape[0] == 1
    predicted, _ = squad_predictions(str(ck), str(squad_bin["2.0"]), "valid", cpu=True)
    contexts = {"q1": SHORT, "q4": SHORT}
    assert sorted(predicted) == ["q1", "q2", "q3", "q4", "q5"]
    assert all(p.best_span and p.best_span in contexts.get(q, LONG)
               for q, p in predicted.items())
    assert_main_error(convert.main, ["export", ck, "--out", tmp_path / "hf"],
                      "end_dense", "ElectraForQuestionAnswering has no slot for")
