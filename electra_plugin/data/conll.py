"""Token tagging data (NER, chunking, POS) in the CoNLL layout: one word per line, its label in
the last column, a blank line between sentences (``-DOCSTART-`` lines are skipped).

Each word becomes its pieces under the pre-training tokenizer; as the official tagging task
does, a word's label sits on its first piece and the other pieces are not predicted
(target -1). The word-to-piece map is kept, so that predictions go back to words.
"""

import json
import os
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..user_io.errors import ElectraUsageError
from ..user_io.output_dir import lacks
from ..user_io.text_files import read_text

IGNORE = -1  # target of a piece that is not a word's first (and of <s>, </s>)
LABELS_FILE = "labels.txt"
ENTITY_PREFIXES = ("B-", "I-", "E-", "S-", "L-", "U-")


@dataclass
class Sentence:
    words: List[str]
    labels: List[str]


def read_conll(path: str) -> List[Sentence]:
    """Sentences of a CoNLL file: word in the first column, label in the last."""
    lines = read_text(path).splitlines()
    sentences, words, labels = [], [], []
    for number, line in enumerate(lines + [""], start=1):
        columns = line.split()
        if not columns or columns[0] == "-DOCSTART-":
            if words:
                sentences.append(Sentence(words, labels))
                words, labels = [], []
            continue
        if len(columns) < 2:
            raise ElectraUsageError(f"{path}:{number} has one column; a CoNLL line is a word "
                                    f"and its label (the last column), whitespace-separated")
        words.append(columns[0])
        labels.append(columns[-1])
    if not sentences:
        raise ElectraUsageError(f"{path} holds no sentences")
    return sentences


def label_list(sentences: Sequence[Sentence]) -> List[str]:
    """The training labels in a fixed order: "O" first when present, then sorted."""
    found = {label for s in sentences for label in s.labels}
    return (["O"] if "O" in found else []) + sorted(found - {"O"})


def is_entity_scheme(labels: Sequence[str]) -> bool:
    """Whether the labels are BIO/BIOES chunks (scored by entity F1) rather than plain tags
    such as parts of speech (scored by accuracy)."""
    return all(label == "O" or label.startswith(ENTITY_PREFIXES) for label in labels) and \
        any(label != "O" for label in labels)


@dataclass
class TaggedSentence:
    """One model input: ``<s> pieces </s>``, the target per position and where each word
    starts (0 for a word cut off by the length limit)."""

    tokens: List[int]
    targets: List[int]
    first_pieces: List[int]


def encode(sentence: Sentence, tokenizer, dictionary, labels: Sequence[str], max_seq_len: int,
           unknown_label_where: str) -> TaggedSentence:
    index = {label: i for i, label in enumerate(labels)}
    tokens, targets, first = [dictionary.bos()], [IGNORE], []
    for word, label in zip(sentence.words, sentence.labels):
        if label not in index:
            raise ElectraUsageError(f"{unknown_label_where}: label {label!r} is not among the "
                                    f"training labels {list(labels)}; the model learns only the "
                                    f"training file's classes: relabel it or add examples of "
                                    f"it to --train")
        pieces = [dictionary.index(p) for p in tokenizer.pieces(word)] or [dictionary.unk()]
        if len(tokens) + len(pieces) > max_seq_len - 1:  # room for </s>
            first.append(0)
            continue
        first.append(len(tokens))
        targets += [index[label]] + [IGNORE] * (len(pieces) - 1)
        tokens += pieces
    return TaggedSentence(tokens + [dictionary.eos()], targets + [IGNORE], first)


def metadata_path(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, f"{split}.tagging.json")


def data_problem(data_dir: str, splits: Sequence[str] = ("train", "valid")) -> Optional[str]:
    """Why ``data_dir`` is not electra-tag preprocess's output with ``splits``, or None when it
    is: what token_tagging reads, dict.txt, labels.txt and each split's pieces
    (``{split}.input``), targets (``{split}.target``) and word map."""
    return lacks(data_dir, ["dict.txt", LABELS_FILE] + [
        name for split in splits for name in (
            f"{split}.input.bin", f"{split}.input.idx", f"{split}.target.bin",
            f"{split}.target.idx", f"{split}.tagging.json")])


def save_metadata(data_dir, split, sentences: Sequence[Sentence],
                  encoded: Sequence[TaggedSentence], labels: Sequence[str], source: str):
    with open(metadata_path(data_dir, split), "w", encoding="utf-8") as f:
        json.dump({"labels": list(labels), "source": source,
                   "sentences": [dict(asdict(s), first_pieces=e.first_pieces)
                                 for s, e in zip(sentences, encoded)]}, f, ensure_ascii=False)


def load_metadata(data_dir: str, split: str) -> Tuple[List[Sentence], List[List[int]], List[str]]:
    """-> (sentences, each word's first-piece position, labels) of a preprocessed split."""
    path = metadata_path(data_dir, split)
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise ElectraUsageError(f"{path} is missing; make tagging data with electra-tag "
                                f"preprocess") from None
    sentences = [Sentence(s["words"], s["labels"]) for s in meta["sentences"]]
    return sentences, [s["first_pieces"] for s in meta["sentences"]], meta["labels"]


def write_conll(path: str, sentences: Sequence[Sentence], predicted: Sequence[Sequence[str]]):
    """``word gold predicted`` per line, a blank line after each sentence (conlleval's input)."""
    with open(path, "w", encoding="utf-8") as f:
        for sentence, tags in zip(sentences, predicted):
            for word, gold, tag in zip(sentence.words, sentence.labels, tags):
                f.write(f"{word} {gold} {tag}\n")
            f.write("\n")


def tagging_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]],
                   labels: Sequence[str]) -> dict:
    """Entity precision/recall/F1 (seqeval, conlleval's counting) for chunk labels, and the
    token accuracy always; in percent. See :func:`per_type_scores` for each entity type's."""
    from seqeval.metrics import f1_score, precision_score, recall_score

    pairs = [(g, p) for gs, ps in zip(gold, predicted) for g, p in zip(gs, ps)]
    scores = {"accuracy": 100.0 * sum(g == p for g, p in pairs) / max(1, len(pairs))}
    if is_entity_scheme(labels):
        gold, predicted = [list(g) for g in gold], [list(p) for p in predicted]
        # zero_division=0: seqeval's value for no predicted (or gold) entity, without its
        # warning at every early validation
        scores = {name: 100.0 * float(score(gold, predicted, zero_division=0))
                  for name, score in (("f1", f1_score), ("precision", precision_score),
                                      ("recall", recall_score))} | scores
    return scores


def per_type_scores(gold: Sequence[Sequence[str]],
                    predicted: Sequence[Sequence[str]]) -> Dict[str, Dict[str, float]]:
    """{entity type: {precision, recall, f1 (percent), support (gold entities)}} by seqeval's
    counting; empty for tags that are not chunks."""
    from seqeval.metrics import classification_report

    labels = {label for labels in list(gold) + list(predicted) for label in labels}
    if not is_entity_scheme(labels):
        return {}
    report = classification_report([list(g) for g in gold], [list(p) for p in predicted],
                                   output_dict=True, zero_division=0)
    return {kind: {"precision": 100.0 * float(r["precision"]),
                   "recall": 100.0 * float(r["recall"]), "f1": 100.0 * float(r["f1-score"]),
                   "support": int(r["support"])}
            for kind, r in sorted(report.items()) if not kind.endswith(" avg")}
