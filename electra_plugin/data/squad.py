"""SQuAD v1.1 / v2.0 for span extraction: reading, windows, binarization.

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
4. :mod:`.squad_answers` turns per-window logits into answers and scores them.
"""

import json
import logging
import os
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..user_io.errors import ElectraUsageError
from ..user_io.output_dir import lacks
from ..user_io.text_files import read_text
from .binarize import MAX_SEQ_LEN as LONGEST

logger = logging.getLogger(__name__)

METADATA_FORMAT = "electra_plugin.squad"
METADATA_VERSION = 1
VERSIONS = ("1.1", "2.0")

# Defaults of the official ELECTRA code (configure_finetuning.py; max_seq_length is 512 for
# SQuAD there, 384 in BERT's run_squad.py).
MAX_SEQ_LEN = 512
DOC_STRIDE = 128
MAX_QUERY_LEN = 64


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
    if not os.path.exists(path):
        raise ElectraUsageError(f"SQuAD file {path} does not exist")
    text = read_text(path)
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ElectraUsageError(f"cannot read SQuAD file {path}: {e}") from None
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
    if max_seq_len > LONGEST:
        raise ElectraUsageError(f"--max-seq-len {max_seq_len} is more than {LONGEST} tokens, "
                                f"the longest window (and at most the model's --max-positions)")
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


def data_problem(data_dir: str, splits: Sequence[str] = ("train", "valid")) -> Optional[str]:
    """Why ``data_dir`` is not electra-squad preprocess's output with ``splits``, or None when
    it is: what the squad task reads, dict.txt and each split's :func:`split_paths`."""
    return lacks(data_dir, ["dict.txt"] + [
        f"{split}{part}" for split in splits for part in (
            ".input.bin", ".input.idx", ".target.bin", ".target.idx", ".squad.json")])


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
