"""SQuAD v1.1 / v2.0 for span extraction: reading, windows, binarization, answers, scores.

The pipeline, in the order the official BERT/ELECTRA code runs it:

1. :func:`read_squad` reads an official SQuAD JSON file and checks it (missing fields,
   answers that do not match the context at ``answer_start``).
2. :func:`make_windows` tokenizes every question and context with the pre-training data's
   tokenizer, keeping each context piece's character span, and cuts the context into
   overlapping windows: ``<s> question </s> context-window </s>``, at most ``max_seq_len``
   tokens, the question cut to ``max_query_len`` pieces, successive windows ``doc_stride``
   pieces apart. A window's target is the (start, end) position of the answer's first and
   last piece, or (0, 0), the ``<s>`` token, when the answer is not wholly inside the window
   or the question has none (SQuAD 2.0).
3. :func:`write_split` stores the token ids and targets as fairseq indexed datasets
   (``{split}.input``, ``{split}.target``) and everything needed to map a prediction back to
   text in ``{split}.squad.json`` (:class:`SquadMetadata`).
4. :func:`predict_answers` turns per-window start/end (and no-answer) logits into one answer
   per question (n-best search over the windows), and :func:`squad_scores` computes the
   official EM/F1.
"""

import json
import logging
import math
import os
import re
import string
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ElectraUsageError

logger = logging.getLogger(__name__)

METADATA_FORMAT = "electra_plugin.squad"
METADATA_VERSION = 1
VERSIONS = ("1.1", "2.0")

# Defaults of the official ELECTRA code (configure_finetuning.py; max_seq_length is 512 for
# SQuAD there, 384 in BERT's run_squad.py).
MAX_SEQ_LEN = 512
DOC_STRIDE = 128
MAX_QUERY_LEN = 64
N_BEST_SIZE = 20
MAX_ANSWER_LEN = 30


# ---------------------------------------------------------------------------------- reading
@dataclass
class SquadExample:
    qid: str
    question: str
    context: int  # index into SquadData.contexts
    answers: List[Tuple[str, int]]  # (text, character start); training uses the first
    is_impossible: bool = False


@dataclass
class SquadData:
    version: str
    contexts: List[str]
    examples: List[SquadExample]
    realigned: int = 0  # answers moved to the nearest occurrence of their text
    labelled: bool = True  # False: questions without gold answers (a test set), not scored


def _require(obj, key, kind, where, path):
    if not isinstance(obj, dict) or key not in obj:
        raise ElectraUsageError(f"{path}: {where} has no '{key}' field; is this an official "
                                f"SQuAD JSON file (data -> paragraphs -> context, qas)?")
    value = obj[key]
    if not isinstance(value, kind):
        raise ElectraUsageError(f"{path}: {where}.{key} is a {type(value).__name__}, expected "
                                f"{kind.__name__ if isinstance(kind, type) else kind[0].__name__}")
    return value


def _nearest(context: str, text: str, start: int) -> int:
    """Start of the occurrence of ``text`` in ``context`` nearest to ``start``, or -1."""
    best, at = -1, context.find(text)
    while at >= 0:
        if best < 0 or abs(at - start) < abs(best - start):
            best = at
        at = context.find(text, at + 1)
    return best


def read_squad(path: str, version: Optional[str] = None, realign: bool = False,
               labelled: Optional[bool] = True) -> SquadData:
    """Read and check an official SQuAD v1.1 or v2.0 JSON file.

    ``labelled`` None: a file none of whose questions has an answer or an ``is_impossible``
    field is a test set without gold answers, read as questions alone.

    ``version`` None detects 2.0 from any ``is_impossible`` field. Every answer's text must
    equal ``context[answer_start:answer_start + len(text)]``; with ``realign`` an answer that
    does not is moved to the nearest occurrence of its text in the context (the released
    SQuAD dev sets have a few answers whose start is off by one) and only an answer whose text
    is nowhere in the context is an error.
    """
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ElectraUsageError(f"SQuAD file {path} does not exist")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ElectraUsageError(f"cannot read SQuAD file {path}: {e}")
    articles = _require(raw, "data", list, "the top level", path)
    if labelled is None:
        labelled = any(isinstance(qa, dict) and (qa.get("answers") or "is_impossible" in qa)
                       for a in articles if isinstance(a, dict)
                       for p in a.get("paragraphs", []) if isinstance(p, dict)
                       for qa in p.get("qas", []))
    if version is None:
        version = "2.0" if any(
            isinstance(qa, dict) and "is_impossible" in qa
            for a in articles if isinstance(a, dict)
            for p in a.get("paragraphs", []) if isinstance(p, dict)
            for qa in p.get("qas", [])) else "1.1"
    if version not in VERSIONS:
        raise ElectraUsageError(f"unknown SQuAD version {version!r}; use one of {VERSIONS}")

    data = SquadData(version, [], [], labelled=labelled)
    seen = set()
    mismatched = []
    for i, article in enumerate(articles):
        for j, paragraph in enumerate(_require(article, "paragraphs", list, f"data[{i}]", path)):
            where = f"data[{i}].paragraphs[{j}]"
            context = _require(paragraph, "context", str, where, path)
            qas = _require(paragraph, "qas", list, where, path)
            if not context.strip():
                raise ElectraUsageError(f"{path}: {where}.context is empty")
            data.contexts.append(context)
            for k, qa in enumerate(qas):
                qwhere = f"{where}.qas[{k}]"
                qid = str(_require(qa, "id", (str, int), qwhere, path))
                question = _require(qa, "question", str, qwhere, path)
                answers = _require(qa, "answers", list, qwhere, path) if labelled else []
                impossible = qa.get("is_impossible", False) if labelled else False
                if not isinstance(impossible, bool):
                    raise ElectraUsageError(f"{path}: {qwhere}.is_impossible is not true/false")
                if qid in seen:
                    raise ElectraUsageError(f"{path}: question id {qid!r} occurs twice")
                seen.add(qid)
                if impossible and version == "1.1":
                    raise ElectraUsageError(f"{path}: question {qid!r} is_impossible, which "
                                            f"SQuAD 1.1 has not; use --squad-version 2.0")
                if impossible and answers:
                    raise ElectraUsageError(f"{path}: question {qid!r} is_impossible but has "
                                            f"answers (put them in plausible_answers)")
                if labelled and not impossible and not answers:
                    raise ElectraUsageError(
                        f"{path}: question {qid!r} has no answers"
                        + (" and is not marked is_impossible" if version == "2.0" else
                           "; SQuAD 2.0 data needs --squad-version 2.0"))
                checked = []
                for n, answer in enumerate(answers):
                    awhere = f"{qwhere}.answers[{n}]"
                    text = _require(answer, "text", str, awhere, path)
                    start = _require(answer, "answer_start", int, awhere, path)
                    if not text.strip():
                        raise ElectraUsageError(f"{path}: question {qid!r}: answer {n} is empty")
                    if context[start:start + len(text)] != text:
                        moved = _nearest(context, text, start) if realign else -1
                        if moved < 0:
                            mismatched.append((qid, text, start, context))
                            continue
                        start = moved
                        data.realigned += 1
                    checked.append((text, start))
                data.examples.append(SquadExample(qid, question, len(data.contexts) - 1,
                                                  checked, impossible))
    if mismatched:
        qid, text, start, context = mismatched[0]
        there = context[start:start + len(text)]
        hint = ("its text is nowhere in the context" if realign else
                "pass --realign-answers to move such answers to the nearest occurrence of "
                "their text")
        raise ElectraUsageError(
            f"{path}: {len(mismatched)} answer(s) do not match the context at answer_start, "
            f"e.g. question {qid!r}: answer {text!r} at {start}, but the context there reads "
            f"{there!r}; {hint}")
    if not data.examples:
        raise ElectraUsageError(f"{path} holds no questions")
    return data


# ---------------------------------------------------------------------------------- windows
@dataclass
class Window:
    """One model input: ``<s> question </s> context[doc_start:doc_start + doc_len] </s>``."""

    example: int
    doc_start: int  # first context piece in the window
    doc_len: int
    seq_start: int  # position of that piece in ``tokens`` (question length + 2)
    tokens: List[int]
    start: int = 0  # target positions in ``tokens``; 0 (<s>) when the answer is not inside
    end: int = 0


def answer_pieces(offsets: Sequence[Tuple[int, int]], char_start: int, char_end: int):
    """(first, last) piece overlapping the characters [char_start, char_end), or None."""
    hit = [i for i, (s, e) in enumerate(offsets) if s < e and s < char_end and e > char_start]
    return (hit[0], hit[-1]) if hit else None


def check_window_sizes(max_seq_len: int, doc_stride: int, max_query_len: int):
    room = max_seq_len - max_query_len - 3
    if max_query_len < 1 or room < 1:
        raise ElectraUsageError(
            f"--max-seq-len {max_seq_len} leaves no room for the context after a question of "
            f"--max-query-len {max_query_len} and 3 special tokens")
    if not 1 <= doc_stride <= room:
        raise ElectraUsageError(
            f"--doc-stride {doc_stride} must be between 1 and {room} (--max-seq-len minus "
            f"--max-query-len minus 3), or windows would skip context")


def make_windows(data: SquadData, tokenizer, dictionary, max_seq_len=MAX_SEQ_LEN,
                 doc_stride=DOC_STRIDE, max_query_len=MAX_QUERY_LEN):
    """Tokenize and window every question.

    Returns ``(windows, offsets, stats)``: the windows in example order, for every context the
    character span of each of its pieces, and counts for the log.
    """
    check_window_sizes(max_seq_len, doc_stride, max_query_len)
    bos, eos = dictionary.bos(), dictionary.eos()

    def ids(pieces):
        return [dictionary.index(p) for p in pieces]

    context_ids, offsets = [], []
    for context in data.contexts:
        spans = tokenizer.pieces_with_offsets(context)
        context_ids.append(ids([p for p, _, _ in spans]))
        offsets.append([(s, e) for _, s, e in spans])

    windows: List[Window] = []
    stats = Counter()
    for index, example in enumerate(data.examples):
        question = ids(tokenizer.pieces(example.question))
        if not question:
            raise ElectraUsageError(f"question {example.qid!r} is empty after tokenization")
        stats["questions truncated"] += len(question) > max_query_len
        question = question[:max_query_len]
        doc = context_ids[example.context]
        if not doc:
            raise ElectraUsageError(f"the context of question {example.qid!r} is empty after "
                                    f"tokenization")
        target = None
        if example.answers:  # none: unanswerable, or a test set's question
            text, char_start = example.answers[0]
            target = answer_pieces(offsets[example.context], char_start, char_start + len(text))
            if target is None:
                stats["answers covering no piece"] += 1
        room = max_seq_len - len(question) - 3
        seq_start = len(question) + 2
        doc_start = 0
        while True:
            doc_len = min(len(doc) - doc_start, room)
            window = Window(index, doc_start, doc_len, seq_start,
                            [bos] + question + [eos] + doc[doc_start:doc_start + doc_len] + [eos])
            if target is not None and doc_start <= target[0] and target[1] < doc_start + doc_len:
                window.start = seq_start + target[0] - doc_start
                window.end = seq_start + target[1] - doc_start
            stats["windows"] += 1
            stats["windows without the answer"] += window.start == 0
            windows.append(window)
            if doc_start + doc_len >= len(doc):
                break
            doc_start += min(doc_len, doc_stride)
    return windows, offsets, stats


# ------------------------------------------------------------------------------- binarizing
@dataclass
class SquadMetadata:
    """What ``{split}.squad.json`` holds: enough to turn window logits into answer text."""

    version: str
    max_seq_len: int
    doc_stride: int
    max_query_len: int
    contexts: List[str]
    offsets: List[List[int]]  # per context: flattened [start0, end0, start1, end1, ...]
    examples: List[SquadExample]
    windows: List[Tuple[int, int, int, int]]  # (example, doc_start, doc_len, seq_start)
    source: str = ""
    labelled: bool = True  # False: a test set without gold answers

    def piece_offsets(self, context: int) -> np.ndarray:
        """n x 2 character spans of the pieces of a context."""
        return np.asarray(self.offsets[context], dtype=np.int64).reshape(-1, 2)

    def save(self, path):
        meta = {"format": METADATA_FORMAT, "format_version": METADATA_VERSION}
        meta.update(asdict(self))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(meta, f, ensure_ascii=False)

    @classmethod
    def load(cls, path) -> "SquadMetadata":
        try:
            with open(path, encoding="utf-8") as f:
                meta = json.load(f)
        except FileNotFoundError:
            raise ElectraUsageError(f"{path} is missing; make SQuAD data with "
                                    f"electra-squad preprocess")
        except (OSError, ValueError) as e:
            raise ElectraUsageError(f"cannot read {path}: {e}")
        if meta.pop("format", None) != METADATA_FORMAT:
            raise ElectraUsageError(f"{path} is not SQuAD metadata written by electra-squad")
        meta.pop("format_version", None)
        meta["examples"] = [SquadExample(e["qid"], e["question"], e["context"],
                                         [tuple(a) for a in e["answers"]], e["is_impossible"])
                            for e in meta["examples"]]
        meta["windows"] = [tuple(w) for w in meta["windows"]]
        return cls(**meta)


def split_paths(data_dir: str, split: str) -> Dict[str, str]:
    prefix = os.path.join(data_dir, split)
    return {"input": prefix + ".input", "target": prefix + ".target",
            "metadata": prefix + ".squad.json"}


def write_split(data_dir, split, data: SquadData, windows, offsets, vocab_size,
                max_seq_len, doc_stride, max_query_len, source=""):
    """Binarize windows with fairseq's indexed-dataset builders and write the metadata."""
    import torch
    from fairseq.data import indexed_dataset

    paths = split_paths(data_dir, split)
    tokens = indexed_dataset.make_builder(paths["input"] + ".bin", "mmap", vocab_size=vocab_size)
    targets = indexed_dataset.MMapIndexedDatasetBuilder(paths["target"] + ".bin",
                                                        dtype=np.int32)
    for w in windows:
        tokens.add_item(torch.IntTensor(w.tokens))
        targets.add_item(torch.IntTensor([w.start, w.end]))
    tokens.finalize(paths["input"] + ".idx")
    targets.finalize(paths["target"] + ".idx")
    SquadMetadata(
        version=data.version, max_seq_len=max_seq_len, doc_stride=doc_stride,
        max_query_len=max_query_len, contexts=data.contexts,
        offsets=[[x for span in spans for x in span] for spans in offsets],
        examples=data.examples,
        windows=[(w.example, w.doc_start, w.doc_len, w.seq_start) for w in windows],
        source=source, labelled=data.labelled,
    ).save(paths["metadata"])
    return paths


# ------------------------------------------------------------------------------- prediction
@dataclass
class WindowLogits:
    """Model outputs for one window (numpy, the window's own length, no padding)."""

    start: np.ndarray  # T
    end: np.ndarray  # T
    no_answer: Optional[float] = None  # SQuAD 2.0: > 0 means "no answer in this window"


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


def predict_answers(meta: SquadMetadata, logits: Dict[int, WindowLogits],
                    n_best_size=N_BEST_SIZE, max_answer_len=MAX_ANSWER_LEN,
                    no_answer_threshold=0.0) -> Dict[str, Prediction]:
    """n-best span search over each question's windows -> {question id: Prediction}.

    Candidates are (start, end) pairs of context pieces from the ``n_best_size`` best start
    and end logits of each window, with start <= end, at most ``max_answer_len`` pieces, and
    a start the window sees with maximal context; a span scores start + end logit and its
    text is the original context between the first piece's start and the last piece's end.
    For SQuAD 2.0 the answer is "" when the no-answer score (the smallest no-answer logit
    over the question's windows) exceeds ``no_answer_threshold``.
    """
    members = defaultdict(list)
    for w, window in enumerate(meta.windows):
        members[window[0]].append(w)
    out = {}
    for index, example in enumerate(meta.examples):
        context = meta.contexts[example.context]
        offsets = meta.piece_offsets(example.context)
        is_max = max_context(meta.windows, members[index])
        scores: Dict[str, float] = {}
        null = math.inf
        for w in members[index]:
            if w not in logits:
                raise ElectraUsageError(f"no model output for window {w} of question "
                                        f"{example.qid!r}")
            out_w = logits[w]
            _, doc_start, doc_len, seq_start = meta.windows[w]
            start = np.asarray(out_w.start[seq_start:seq_start + doc_len], dtype=np.float64)
            end = np.asarray(out_w.end[seq_start:seq_start + doc_len], dtype=np.float64)
            if out_w.no_answer is not None:
                null = min(null, float(out_w.no_answer))
            starts = [i for i in np.argsort(-start, kind="stable") if is_max[w][i]][:n_best_size]
            ends = np.argsort(-end, kind="stable")[:n_best_size]
            for i in starts:
                for j in ends:
                    if j < i or j - i + 1 > max_answer_len:
                        continue
                    a, b = offsets[doc_start + i][0], offsets[doc_start + j][1]
                    text = context[a:b].strip()
                    score = float(start[i] + end[j])
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
