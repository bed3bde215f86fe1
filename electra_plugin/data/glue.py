"""The GLUE benchmark as the official file layout defines it: columns, labels, metrics, train
set sizes.

One table serves the preprocessing and the evaluation script. The fine-tuning recipe (epochs,
batch, lr) lives in the hydra configs of examples/glue/config/; tests/test_glue.py checks that
what they restate from this table (classes, checkpoint metric, updates per epoch) agrees.
"""

import csv
import io
import os
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from ..user_io.errors import ElectraUsageError
from ..user_io.output_dir import lacks
from ..user_io.text_files import read_text


# written by electra-glue preprocess beside the test splits: the task, each split's server
# file and example ids
TEST_OUTPUTS = "test_outputs.json"


@dataclass(frozen=True)
class TestSplit:
    """An unlabelled split: its TSV's name, the file the GLUE server reads its predictions
    from, and where its sentences are (test files lay out their columns their own way)."""

    tsv: str
    server_file: str
    text_columns: Tuple[int, ...]
    header: bool = True


@dataclass(frozen=True)
class GlueTask:
    name: str  # directory name in the official layout
    text_columns: Tuple[int, ...]  # 0-based columns of the sentence(s)
    label_column: int  # may be negative (from the end)
    labels: Optional[Tuple[str, ...]]  # None: regression (STS-B)
    metrics: Tuple[str, ...]  # the official metric(s); the first one picks checkpoints
    train_size: int  # official train set size: the configs' updates are epochs x batches of it
    header: bool = True
    dev_splits: Tuple[str, ...] = ("dev",)
    test_splits: Tuple[TestSplit, ...] = ()
    # train also on each pair in the other order (the official double_unordered: on for
    # MRPC and STS-B, whose labels do not depend on the order)
    double_unordered: bool = False

    @property
    def num_classes(self):
        return 1 if self.labels is None else len(self.labels)


GLUE_TASKS: Dict[str, GlueTask] = {t.name: t for t in [
    GlueTask("CoLA", (3,), 1, ("0", "1"), ("mcc",), 8551, header=False,
             test_splits=(TestSplit("test", "CoLA.tsv", (1,)),)),
    GlueTask("SST-2", (0,), 1, ("0", "1"), ("accuracy",), 67349,
             test_splits=(TestSplit("test", "SST-2.tsv", (1,)),)),
    GlueTask("MRPC", (3, 4), 0, ("0", "1"), ("f1", "accuracy"), 3668,
             test_splits=(TestSplit("test", "MRPC.tsv", (3, 4)),), double_unordered=True),
    GlueTask("QQP", (3, 4), 5, ("0", "1"), ("f1", "accuracy"), 363846,
             test_splits=(TestSplit("test", "QQP.tsv", (1, 2)),)),
    GlueTask("STS-B", (7, 8), -1, None, ("pearson", "spearman"), 5749,
             test_splits=(TestSplit("test", "STS-B.tsv", (7, 8)),), double_unordered=True),
    GlueTask("MNLI", (8, 9), -1, ("contradiction", "entailment", "neutral"), ("accuracy",),
             392702, dev_splits=("dev_matched", "dev_mismatched"),
             test_splits=(TestSplit("test_matched", "MNLI-m.tsv", (8, 9)),
                          TestSplit("test_mismatched", "MNLI-mm.tsv", (8, 9)),
                          # the diagnostic set, predicted by the MNLI model
                          TestSplit("diagnostic", "AX.tsv", (1, 2)))),
    GlueTask("QNLI", (1, 2), -1, ("entailment", "not_entailment"), ("accuracy",), 104743,
             test_splits=(TestSplit("test", "QNLI.tsv", (1, 2)),)),
    GlueTask("RTE", (1, 2), -1, ("entailment", "not_entailment"), ("accuracy",), 2490,
             test_splits=(TestSplit("test", "RTE.tsv", (1, 2)),)),
    GlueTask("WNLI", (1, 2), -1, ("0", "1"), ("accuracy",), 635,
             test_splits=(TestSplit("test", "WNLI.tsv", (1, 2)),)),
]}


def get_task(name: str) -> GlueTask:
    for task in GLUE_TASKS.values():
        if name.lower().replace("-", "") == task.name.lower().replace("-", ""):
            return task
    raise ElectraUsageError(f"unknown GLUE task '{name}'; choose one of {', '.join(GLUE_TASKS)}")


def data_problem(task: GlueTask, directory: str,
                 splits: Optional[Sequence[str]] = None) -> Optional[str]:
    """Why ``directory`` is not electra-glue preprocess's output for ``task``, or None when it
    is: what fairseq's sentence_prediction reads, ``input0/`` (and ``input1/`` for pairs) with
    dict.txt and each split's .bin/.idx, and ``label/`` with the classes' dict.txt (in the
    task's order, which the metrics read) and .bin/.idx, or a regression's .label files.
    ``splits``: fairseq's names (default the training and dev splits)."""
    splits = splits or ["train"] + [f"valid{i or ''}" for i in range(len(task.dev_splits))]
    inputs = [f"input{k}" for k in range(len(task.text_columns))]
    shape = "sentence pairs" if len(inputs) == 2 else "single sentences"
    if os.path.isdir(os.path.join(directory, f"input{len(inputs)}")):
        return f"has more inputs than {task.name}'s {shape} (input{len(inputs)}/)"
    label_dict = os.path.join(directory, "label", "dict.txt")
    if task.labels is None and os.path.isfile(label_dict):
        return f"has classes (label/dict.txt); {task.name} is a regression task"
    if task.labels is not None and not os.path.isfile(label_dict) and \
            os.path.isfile(os.path.join(directory, "label", "train.label")):
        return f"has regression targets (label/train.label); {task.name} has classes"
    files = [f"{i}/dict.txt" for i in inputs]
    files += [f"{i}/{s}.{e}" for i in inputs for s in splits for e in ("bin", "idx")]
    if task.labels is None:
        files += [f"label/{s}.label" for s in splits]
    else:
        files += ["label/dict.txt"] + [f"label/{s}.{e}" for s in splits for e in ("bin", "idx")]
    missing = lacks(directory, files)
    if missing or task.labels is None:
        return missing
    with open(label_dict, encoding="utf-8") as f:
        labels = tuple(line.split()[0] for line in f if line.strip())
    if labels != task.labels:
        return (f"has the labels {', '.join(labels)} (label/dict.txt); {task.name}'s are "
                f"{', '.join(task.labels)}")
    return None


def read_columns(path: str, header: bool) -> List[List[str]]:
    """The rows of a tab-separated file as GLUE's are read (no quoting), without its header."""
    csv.field_size_limit(sys.maxsize)
    text = io.StringIO(read_text(path), newline="")
    rows = list(csv.reader(text, delimiter="\t", quoting=csv.QUOTE_NONE))
    return rows[1:] if header and rows else rows


def numbered_rows(task: GlueTask, path: str, labelled: bool = True,
                  test: Optional[TestSplit] = None):
    """-> [(line number, row)] of a TSV, each row refused in one line unless it holds the
    text columns and, ``labelled``, a label column of its own: a label counted from the end
    lies after the text, so a row that lost its label is not read as text and label in one."""
    columns = task.text_columns if test is None else test.text_columns
    header = task.header if test is None else test.header
    need = max(c + 1 if c >= 0 else -c for c in columns)
    if labelled and task.label_column >= 0:
        need = max(need, task.label_column + 1)
    elif labelled:
        need = max(need, max((c for c in columns if c >= 0), default=-1) + 1 - task.label_column)
    numbered = list(enumerate(read_columns(path, header), start=2 if header else 1))
    for number, row in numbered:
        if len(row) < need:
            layout = (f"is this the official GLUE file for {task.name}?" if task.name in GLUE_TASKS
                      else f"text in column(s) {','.join(map(str, columns))}"
                           + (f", the label in column {task.label_column}" if labelled else ""))
            raise ElectraUsageError(f"{path}:{number} has {len(row)} tab-separated columns, "
                                    f"{task.name} needs at least {need}; {layout}")
    return numbered


def read_split(task: GlueTask, path: str, labelled: bool = True,
               test: Optional[TestSplit] = None):
    """-> (list of sentence tuples, list of label strings or None) from an official TSV;
    ``test``: an unlabelled split laid out as it says."""
    columns = task.text_columns if test is None else test.text_columns
    sentences, labels = [], []
    for number, row in numbered_rows(task, path, labelled, test):
        sentences.append(tuple(row[c] for c in columns))
        if labelled:
            label = row[task.label_column].strip()
            if task.labels is None:
                try:
                    float(label)
                except ValueError:
                    raise ElectraUsageError(
                        f"{path}:{number}: '{label}' is not a number ({task.name} is a "
                        f"regression task)") from None
            elif label not in task.labels:
                raise ElectraUsageError(
                    f"{path}:{number}: label '{label}' is not one of {task.name}'s labels "
                    f"{list(task.labels)}")
            labels.append(label)
    if not sentences:
        raise ElectraUsageError(f"{path} holds no examples")
    return sentences, (labels if labelled else None)


def read_ids(test: TestSplit, path: str) -> List[str]:
    """The example ids (first column) of an unlabelled split, as its server file names them."""
    return [row[0] for row in read_columns(path, test.header)]


# --- the official metrics: scikit-learn and scipy, as GLUE's own evaluation uses --------

def accuracy(pred: Sequence, gold: Sequence) -> float:
    return float(accuracy_score(gold, pred))


def f1(pred: Sequence[int], gold: Sequence[int]) -> float:
    """F1 of class 1; 0 when nothing is predicted or gold as class 1."""
    return float(f1_score(gold, pred, pos_label=1, zero_division=0.0))


def mcc(pred: Sequence[int], gold: Sequence[int]) -> float:
    """Matthews correlation (0 when a marginal is empty)."""
    return float(matthews_corrcoef(gold, pred))


def _correlation(statistic, x: Sequence[float], y: Sequence[float]) -> float:
    # scipy gives nan (and a warning) for a constant input, where the correlation is 0 here
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(statistic(x, y)[0])


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    return _correlation(pearsonr, x, y)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    return _correlation(spearmanr, x, y)


METRICS = {"accuracy": accuracy, "f1": f1, "mcc": mcc, "pearson": pearson, "spearman": spearman}


def score(task: GlueTask, pred: List, gold: List) -> Dict[str, float]:
    """The task's official metrics, in percent."""
    return {name: 100.0 * METRICS[name](pred, gold) for name in task.metrics}


def constant_baseline(task: GlueTask, gold: List) -> Dict[str, float]:
    """Each metric's best score over the predictions that give every example one class (the
    majority class, for accuracy): what a model that learned nothing of its inputs reaches.
    0 for a regression task (a constant has no correlation)."""
    if task.labels is None:
        return {name: 0.0 for name in task.metrics}
    constant = [score(task, [c] * len(gold), gold) for c in range(task.num_classes)]
    return {name: max(s[name] for s in constant) for name in task.metrics}
