"""Multiple choice data (SWAG, RACE or a generic JSONL) for fairseq's ``sentence_ranking``
task: a context and N options per example, one option right.

The task reads ``input0/{split}`` (the contexts), ``input1..N/{split}`` (option k of every
example) and ``label/{split}.label`` (one index per line; absent for an unlabelled split),
binarized with the dictionary of ``input0/dict.txt``, and scores each option on
``<s> option </s> </s> context </s>`` (``--init-token 0 --separator-token 2``). Text becomes
pieces with the pre-training data's tokenizer and ids with its dict.txt, as electra-glue's
preprocessing does, so the fine-tuning dictionary is the checkpoint's.
"""

import csv
import itertools
import json
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from ..user_io.errors import ElectraUsageError
from ..user_io.output_dir import lacks
from ..user_io.progress import progress
from ..user_io.text_files import read_text
from .tokenizer import normalize_whitespace

FORMATS = ("swag", "race", "jsonl")
# <s> before the option, </s> after it, the separator </s> and the context's </s>
SPECIALS = 4


@dataclass
class Example:
    context: str
    options: List[str]
    label: Optional[int]  # None in an unlabelled (test) split
    where: str  # file and line (or article and question), for errors


def _example(context, options, label, where) -> Example:
    # whitespace as the tokenizers see it, so that what a reader gives is what is encoded
    return Example(normalize_whitespace(context), [normalize_whitespace(o) for o in options],
                   label, where)


def _label(value, choices: int, where: str) -> int:
    label = int(value) if isinstance(value, str) and value.strip().isdigit() else value
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < choices:
        raise ElectraUsageError(f"{where}: label {value!r} is not an option index 0.."
                                f"{choices - 1}")
    return label


def read_swag(path: str) -> List[Example]:
    """SWAG's CSV: the context is sent1, option k is ``sent2 + " " + endingk`` (as
    Hugging Face's run_swag); label is absent from a test file."""
    csv.field_size_limit(sys.maxsize)
    examples = []
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in ("sent1", "sent2", "ending0", "ending1") if c not in header]
            if missing:
                raise ElectraUsageError(
                    f"{path}:1 has no column {', '.join(missing)}; a SWAG file has the "
                    f"columns sent1, sent2, ending0..endingN and (but for a test file) label")
            endings = [f"ending{k}" for k in
                       itertools.takewhile(lambda k: f"ending{k}" in header, itertools.count())]
            for row in reader:
                where = f"{path}:{reader.line_num}"
                if None in row or None in row.values():
                    raise ElectraUsageError(f"{where} does not have the header's "
                                            f"{len(header)} comma-separated columns")
                label = _label(row["label"], len(endings), where) if "label" in row else None
                examples.append(_example(row["sent1"], [f"{row['sent2']} {row[e]}"
                                                        for e in endings], label, where))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ElectraUsageError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") \
            from None
    return examples


def _json_lines(path: str, text: str) -> Iterator[Tuple[str, object]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield f"{path}:{number}", json.loads(line)
            except json.JSONDecodeError as e:
                raise ElectraUsageError(f"{path}:{number} is not JSON ({e.msg})") from None


def _race_documents(path: str) -> Iterator[Tuple[str, object]]:
    """(where, article) of a file holding one article, a JSON list of them or one per line
    (JSONL); of every file under a directory (the RACE release's train/high/*.txt ...)."""
    if os.path.isdir(path):
        for file in sorted(os.path.join(root, name) for root, _, names in os.walk(path)
                           for name in names if not name.startswith(".")):
            yield from _race_documents(file)
        return
    text = read_text(path)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        first = next((line for line in text.splitlines() if line.strip()), "")
        try:
            json.loads(first)
        except json.JSONDecodeError:
            raise ElectraUsageError(f"{path}:{e.lineno} is not JSON ({e.msg})") from None
        yield from _json_lines(path, text)  # JSONL: its first line is a document
        return
    if isinstance(document, list):
        yield from ((f"{path}, article {i}", d) for i, d in enumerate(document, start=1))
    else:
        yield path, document


def race_option(question: str, option: str) -> str:
    """The option as fairseq's RoBERTa RACE recipe scores it: put into the blank of a
    cloze question, else after the question."""
    return question.replace("_", option) if "_" in question else f"{question} {option}"


def read_race(path: str) -> List[Example]:
    """RACE articles (article, questions, options, answers as letters): one example per
    question, its context the article (answers absent: an unlabelled split)."""
    examples = []
    for where, doc in _race_documents(path):
        fields = ("article", "questions", "options")
        if not isinstance(doc, dict) or any(f not in doc for f in fields):
            raise ElectraUsageError(f"{where} is no RACE article (a JSON object with "
                                    f"article, questions, options and answers)")
        questions, options = doc["questions"], doc["options"]
        answers = doc.get("answers")
        if not isinstance(doc["article"], str) or not isinstance(questions, list) or \
                not isinstance(options, list) or len(options) != len(questions) or \
                (answers is not None and (not isinstance(answers, list)
                                          or len(answers) != len(questions))):
            raise ElectraUsageError(f"{where}: article must be text, and questions, options "
                                    f"and answers lists of the same length")
        for i, question in enumerate(questions):
            at = f"{where}, question {i + 1}"
            choices = options[i]
            if not isinstance(question, str) or not isinstance(choices, list) or \
                    not all(isinstance(c, str) for c in choices):
                raise ElectraUsageError(f"{at}: a question is text and its options a list "
                                        f"of texts")
            label = None
            if answers is not None:
                letter = answers[i]
                letters = "".join(chr(ord("A") + k) for k in range(len(choices)))
                if not isinstance(letter, str) or len(letter) != 1 or letter not in letters:
                    raise ElectraUsageError(f"{at}: answer {letter!r} is not one of the "
                                            f"option letters {letters}")
                label = ord(letter) - ord("A")
            examples.append(_example(doc["article"], [race_option(question, c)
                                                      for c in choices], label, at))
    return examples


def read_jsonl(path: str) -> List[Example]:
    """One JSON object a line: {"context": text, "choices": [texts], "label": index}
    (label absent: an unlabelled split)."""
    examples = []
    for where, obj in _json_lines(path, read_text(path)):
        if not isinstance(obj, dict) or not isinstance(obj.get("context"), str) or \
                not isinstance(obj.get("choices"), list) or \
                not all(isinstance(c, str) for c in obj["choices"]):
            raise ElectraUsageError(
                f"{where} is not {{\"context\": text, \"choices\": [texts], \"label\": "
                f"index}} (RACE articles? pass --format race)")
        label = _label(obj["label"], len(obj["choices"]), where) if "label" in obj else None
        examples.append(_example(obj["context"], obj["choices"], label, where))
    return examples


READERS = {"swag": read_swag, "race": read_race, "jsonl": read_jsonl}


def detect_format(path: str) -> str:
    """The format a file's suffix names: .csv SWAG, .jsonl generic, .json/.txt (or a
    directory of them) RACE."""
    if os.path.isdir(path):
        return "race"
    suffix = os.path.splitext(path)[1].lower()
    fmt = {".csv": "swag", ".jsonl": "jsonl", ".json": "race", ".txt": "race"}.get(suffix)
    if fmt is None:
        raise ElectraUsageError(f"cannot tell the format of {path} from its suffix; pass "
                                f"--format {'|'.join(FORMATS)}")
    return fmt


def read_examples(path: str, fmt: Optional[str] = None) -> List[Example]:
    """A split's examples, checked to be one task: the same number of choices (at least 2)
    throughout, and a label on every example or on none."""
    if not os.path.exists(path):
        raise ElectraUsageError(f"{path} does not exist")
    examples = READERS[fmt or detect_format(path)](path)
    if not examples:
        raise ElectraUsageError(f"{path} holds no examples")
    first = examples[0]
    for e in examples:
        if len(e.options) != len(first.options) or len(e.options) < 2:
            raise ElectraUsageError(
                f"{e.where} has {len(e.options)} choices, the first example "
                f"{len(first.options)}; every example of a split needs the same number, "
                f"at least 2")
        if (e.label is None) != (first.label is None):
            state = {True: "unlabelled", False: "labelled"}
            raise ElectraUsageError(
                f"{e.where} is {state[e.label is None]}, the first example "
                f"{state[first.label is None]}; label every example of a split or none "
                f"(a test split)")
    return examples


def fit(option: int, context: int, budget: int) -> Tuple[int, int]:
    """Lengths no longer than (option, context) that sum to at most ``budget``, taken from
    the longer one first (the context on a tie), as GLUE's sentence pairs are cut."""
    if option + context <= budget:
        return option, context
    if option <= context:
        option = min(option, (budget + 1) // 2)
        return option, budget - option
    context = min(context, budget // 2)
    return budget - context, context


def encode(example: Example, tokenizer, dictionary,
           max_seq_len: int) -> Tuple[List[int], List[List[int]], bool]:
    """-> (the context's ids, each option's ids, whether any was cut), every one ending in
    ``</s>`` as fairseq-preprocess writes a line; cut so that ``<s> option </s> </s>
    context </s>`` of the longest option fits ``max_seq_len``."""
    context = tokenizer.pieces(example.context)
    options = [tokenizer.pieces(o) for o in example.options]
    longest = max(map(len, options))
    option_len, context_len = fit(longest, len(context), max_seq_len - SPECIALS)

    def ids(pieces):
        return [dictionary.index(p) for p in pieces] + [dictionary.eos()]

    return (ids(context[:context_len]), [ids(o[:option_len]) for o in options],
            (option_len, context_len) != (longest, len(context)))


def write_split(destdir: str, split: str, examples: List[Example], tokenizer, dictionary,
                max_seq_len: int) -> int:
    """``input0..N/{split}.bin/.idx`` with fairseq's indexed-dataset builder (the format and
    dtype fairseq-preprocess gives), and ``label/{split}.label`` when labelled; -> how many
    examples were cut."""
    import torch
    from fairseq.data import indexed_dataset

    prefixes = [os.path.join(destdir, f"input{k}", split)
                for k in range(len(examples[0].options) + 1)]
    builders = [indexed_dataset.make_builder(p + ".bin", "mmap", vocab_size=len(dictionary))
                for p in prefixes]
    cut = 0
    for example in examples:
        context, options, was_cut = encode(example, tokenizer, dictionary, max_seq_len)
        cut += was_cut
        for builder, ids in zip(builders, [context] + options):
            builder.add_item(torch.IntTensor(ids))
    for builder, prefix in zip(builders, prefixes):
        builder.finalize(prefix + ".idx")
    if examples[0].label is not None:
        with open(os.path.join(destdir, "label", f"{split}.label"), "w") as f:
            f.writelines(f"{e.label}\n" for e in examples)
    return cut


def write_data_dir(destdir: str, splits: Dict[str, List[Example]], tokenizer, dictionary,
                   dict_txt: str, max_seq_len: int) -> Dict[str, int]:
    """A sentence_ranking data directory of ``splits`` (train, valid, test): every
    ``inputK`` with the pre-training ``dict_txt``; -> the examples cut per split."""
    choices = len(next(iter(splits.values()))[0].options)
    for k in range(choices + 1):
        os.makedirs(os.path.join(destdir, f"input{k}"), exist_ok=True)
        shutil.copyfile(dict_txt, os.path.join(destdir, f"input{k}", "dict.txt"))
    os.makedirs(os.path.join(destdir, "label"), exist_ok=True)
    return {split: write_split(destdir, split, examples, tokenizer, dictionary, max_seq_len)
            for split, examples in splits.items()}


def choices_in(data: str) -> int:
    """The number of options a sentence_ranking data directory holds (input1..inputN)."""
    count = 0
    while os.path.isdir(os.path.join(data, f"input{count + 1}")):
        count += 1
    return count


def data_problem(data: str, splits: Sequence[str] = ("train", "valid")) -> Optional[str]:
    """Why ``data`` is not electra-choice preprocess's output with labelled ``splits``, or
    None when it is: what sentence_ranking reads, input0/dict.txt, the context (input0/) and
    at least two options (input1/, input2/ ...) of each split, and label/{split}.label."""
    inputs = range(max(2, choices_in(data)) + 1)
    return lacks(data, ["input0/dict.txt"] + [
        name for split in splits for name in (
            *(f"input{k}/{split}.{e}" for k in inputs for e in ("bin", "idx")),
            f"label/{split}.label")])


def check_split(data: str, split: str, choices: int) -> bool:
    """Whether ``data`` holds ``split`` with labels; one line when it lacks the split (fairseq
    would fail on the missing file with a traceback)."""
    missing = [f"input{k}/{split}.idx" for k in range(choices + 1)
               if not os.path.isfile(os.path.join(data, f"input{k}", f"{split}.idx"))]
    if missing:
        raise ElectraUsageError(f"{data} has no {split} split of {choices} choices "
                                f"({missing[0]} is missing); write it with electra-choice "
                                f"preprocess")
    return os.path.isfile(os.path.join(data, "label", f"{split}.label"))


def option_scores(model, task, split: str, head: str, device, batch_size: int = 32):
    """-> (N x C scores, gold labels or None) of a split (see :func:`check_split`) in file
    order: the model run once per option with the ranking head, each [B, 1] score side by
    side, as fairseq's sentence_ranking criterion does."""
    import torch
    from fairseq import utils

    choices = task.args.num_classes
    dataset = task.load_dataset(split)
    limit = task.max_positions()
    longest = max(dataset.size(i) for i in range(len(dataset)))
    if limit is not None and longest > limit:
        raise ElectraUsageError(
            f"the {split} split has examples of {longest} tokens, more than the model's "
            f"{limit} positions; preprocess it with --max-seq-len {limit}")
    batches = task.get_batch_iterator(
        dataset=dataset, max_sentences=batch_size, max_positions=limit,
        ignore_invalid_inputs=False, num_workers=0).next_epoch_itr(shuffle=False)
    ids, scores, gold = [], [], []
    model.eval()
    with torch.inference_mode():
        for sample in progress(batches, len(batches), f"ranking the options of {split}"):
            scores.append(torch.cat([
                model(**utils.apply_to_sample(lambda t: t.to(device),
                                              sample[f"net_input{k + 1}"]),
                      classification_head_name=head)[0].float().cpu()
                for k in range(choices)], dim=1))
            ids.append(sample["id"])
            if "target" in sample:
                gold.append(sample["target"].view(-1))
    order = torch.cat(ids).argsort()
    return torch.cat(scores)[order], (torch.cat(gold)[order].tolist() if gold else None)
