"""SQuAD answers: per-window start/end (and no-answer) logits -> one answer per question
(the n-best search over a question's windows), and the official EM/F1 scores (with the best
no-answer threshold for 2.0)."""

import math
import re
import string
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..user_io.errors import ElectraUsageError
from .squad import SquadExample, SquadMetadata

# The official decoding's defaults (google-research/electra configure_finetuning.py)
N_BEST_SIZE = 20
MAX_ANSWER_LEN = 30


@dataclass
class WindowLogits:
    """Model outputs for one window (numpy, the window's own length, no padding)."""

    start: np.ndarray  # T
    end: np.ndarray  # T; joint prediction: K x T, the end logits given each start_top
    no_answer: Optional[float] = None  # SQuAD 2.0: > 0 means "no answer in this window"
    start_top: Optional[np.ndarray] = None  # K: joint prediction's most likely starts


@dataclass
class Prediction:
    answer: str  # the official prediction ("" = no answer)
    best_span: str  # the best non-empty span, whatever the no-answer score
    no_answer_score: Optional[float]  # min over windows of the no-answer logit (2.0)
    nbest: List[dict] = field(default_factory=list)


def max_context(windows: Sequence[Tuple[int, int, int, int]], members: Sequence[int]):
    """For each window of one example, which of its pieces it sees with the most context.

    A piece in several windows belongs to the one where min(left, right) context is largest
    (+ 0.01 x window length to break ties), as in BERT's ``_check_is_max_context``.
    """
    best = {}
    for w in members:
        _, doc_start, doc_len, _ = windows[w]
        for i in range(doc_start, doc_start + doc_len):
            score = min(i - doc_start, doc_start + doc_len - 1 - i) + 0.01 * doc_len
            if i not in best or score > best[i][0]:
                best[i] = (score, w)
    return {w: np.array([best[i][1] == w for i in range(windows[w][1],
                                                        windows[w][1] + windows[w][2])])
            for w in members}


def _pairs(out_w: WindowLogits, seq_start: int, doc_len: int, is_max, n_best_size: int):
    """(start, end, score) of the context pieces: the best starts (seen with maximal
    context) by the best ends, scored by the sum of their logits."""
    start = np.asarray(out_w.start[seq_start:seq_start + doc_len], dtype=np.float64)
    end = np.asarray(out_w.end[seq_start:seq_start + doc_len], dtype=np.float64)
    starts = [i for i in np.argsort(-start, kind="stable") if is_max[i]][:n_best_size]
    ends = np.argsort(-end, kind="stable")[:n_best_size]
    return [(int(i), int(j), float(start[i] + end[j])) for i in starts for j in ends]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    top = x.max(-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))


def _joint_pairs(out_w: WindowLogits, seq_start: int):
    """(start, end, score) of joint prediction, in context pieces: for each of the window's
    K most likely starts, the K most likely ends given it; log p(start) + log p(end|start)."""
    start = _log_softmax(out_w.start)
    ends = _log_softmax(out_w.end)
    k = len(out_w.start_top)
    return [(int(s) - seq_start, int(e) - seq_start, float(start[s] + ends[row, e]))
            for row, s in enumerate(out_w.start_top)
            for e in np.argsort(-ends[row], kind="stable")[:k]]


def predict_answers(meta: SquadMetadata, logits: Dict[int, WindowLogits],
                    n_best_size=N_BEST_SIZE, max_answer_len=MAX_ANSWER_LEN,
                    no_answer_threshold=0.0, partial=False) -> Dict[str, Prediction]:
    """n-best span search over each question's windows -> {question id: Prediction}.

    Candidates are (start, end) pairs of context pieces from the ``n_best_size`` best start
    and end logits of each window, with start <= end, at most ``max_answer_len`` pieces, and
    a start the window sees with maximal context; a span scores start + end logit and its
    text is the original context between the first piece's start and the last piece's end.
    A joint-prediction window gives its own pairs: each of its K most likely starts with the
    K most likely ends given that start, scored by the two log-probabilities (official).
    For SQuAD 2.0 the answer is "" when the no-answer score (the smallest no-answer logit
    over the question's windows) exceeds ``no_answer_threshold``. ``partial``: questions
    with a window that has no logits are left out (a validation cut short) instead of an
    error.
    """
    members = defaultdict(list)
    for w, window in enumerate(meta.windows):
        members[window[0]].append(w)
    out = {}
    for index, example in enumerate(meta.examples):
        context = meta.contexts[example.context]
        offsets = meta.piece_offsets(example.context)
        if partial and any(w not in logits for w in members[index]):
            continue
        is_max = max_context(meta.windows, members[index])
        scores: Dict[str, float] = {}
        null = math.inf
        for w in members[index]:
            if w not in logits:
                raise ElectraUsageError(f"no model output for window {w} of question "
                                        f"{example.qid!r}")
            out_w = logits[w]
            _, doc_start, doc_len, seq_start = meta.windows[w]
            if out_w.no_answer is not None:
                null = min(null, float(out_w.no_answer))
            pairs = _joint_pairs(out_w, seq_start) if out_w.start_top is not None else \
                _pairs(out_w, seq_start, doc_len, is_max[w], n_best_size)
            for i, j, score in pairs:
                if not (0 <= i <= j < doc_len) or j - i + 1 > max_answer_len or \
                        not is_max[w][i]:
                    continue
                a, b = offsets[doc_start + i][0], offsets[doc_start + j][1]
                text = context[a:b].strip()
                if text and score > scores.get(text, -math.inf):
                    scores[text] = score
        ranked = sorted(scores.items(), key=lambda kv: -kv[1])[:n_best_size]
        top = max((s for _, s in ranked), default=0.0)
        weights = [math.exp(s - top) for _, s in ranked]
        nbest = [{"text": t, "score": s, "probability": x / sum(weights)}
                 for (t, s), x in zip(ranked, weights)]
        best = ranked[0][0] if ranked else ""
        no_answer = None if null == math.inf else null
        answer = "" if no_answer is not None and no_answer > no_answer_threshold else best
        out[example.qid] = Prediction(answer, best, no_answer, nbest)
    return out


# ---------------------------------------------------------------------- official evaluation
def normalize_answer(s: str) -> str:
    """Lower-case; drop punctuation, the articles a/an/the, and extra whitespace (official)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_score(prediction: str, gold: str) -> int:
    return int(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    """Token-level F1 of the normalized strings; two empty answers score 1 (official v2.0)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def gold_answers(example: SquadExample) -> List[str]:
    """Gold texts as the official v2.0 script takes them; "" for an unanswerable question."""
    texts = [t for t, _ in example.answers if normalize_answer(t)]
    return texts or [""]


def squad_scores(examples: Sequence[SquadExample], predictions: Dict[str, str],
                 no_answer_scores: Optional[Dict[str, float]] = None,
                 best_spans: Optional[Dict[str, str]] = None) -> Dict[str, float]:
    """Official SQuAD EM/F1 (x100), max over each question's gold answers.

    A question without a prediction scores 0 (as the v1.1 script counts it). With
    ``no_answer_scores`` and ``best_spans`` (the best non-empty span of each question) also
    the official v2.0 ``best_exact``/``best_f1``: the scores at the best no-answer threshold.
    """
    exact, f1 = {}, {}
    for ex in examples:
        pred = predictions.get(ex.qid)
        golds = gold_answers(ex)
        exact[ex.qid] = 0 if pred is None else max(exact_score(pred, g) for g in golds)
        f1[ex.qid] = 0.0 if pred is None else max(f1_score(pred, g) for g in golds)
    result = {"exact": 100.0 * sum(exact.values()) / len(examples),
              "f1": 100.0 * sum(f1.values()) / len(examples), "total": len(examples)}
    has = [ex for ex in examples if not ex.is_impossible]
    if len(has) < len(examples):
        for name, group in (("HasAns", has), ("NoAns", [e for e in examples if e.is_impossible])):
            if group:
                result[f"{name}_exact"] = 100.0 * sum(exact[e.qid] for e in group) / len(group)
                result[f"{name}_f1"] = 100.0 * sum(f1[e.qid] for e in group) / len(group)
                result[f"{name}_total"] = len(group)
    if no_answer_scores and best_spans:
        for name, raw in (("exact", exact_score), ("f1", f1_score)):
            span_scores = {ex.qid: max(raw(best_spans.get(ex.qid, ""), g)
                                       for g in gold_answers(ex)) for ex in examples}
            best, thresh = _best_threshold(examples, best_spans, span_scores, no_answer_scores)
            result[f"best_{name}"], result[f"best_{name}_thresh"] = best, thresh
    return result


def _best_threshold(examples, spans, span_scores, null_scores):
    """The official v2.0 ``find_best_thresh``: answer "" when the null score > threshold."""
    score = best = sum(ex.is_impossible for ex in examples)  # everything predicted empty
    thresh = min(null_scores.values()) - 1.0  # below every score: no question answered
    for ex in sorted(examples, key=lambda e: null_scores.get(e.qid, math.inf)):
        if ex.qid not in null_scores:
            continue
        if not ex.is_impossible:
            score += span_scores[ex.qid]
        elif spans.get(ex.qid):
            score -= 1
        if score > best:
            best, thresh = score, null_scores[ex.qid]
    return 100.0 * best / len(examples), thresh
