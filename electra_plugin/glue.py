"""The GLUE benchmark as the official file layout defines it: columns, labels, metrics, train
set sizes.

One table serves the preprocessing and the evaluation script. The fine-tuning recipe (epochs,
batch, lr) lives in the hydra configs of examples/glue/config/; tests/test_glue.py checks that
what they restate from this table (classes, checkpoint metric, updates per epoch) agrees.
"""

import csv
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from .errors import ElectraUsageError


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

    @property
    def num_classes(self):
        return 1 if self.labels is None else len(self.labels)


GLUE_TASKS: Dict[str, GlueTask] = {t.name: t for t in [
    GlueTask("CoLA", (3,), 1, ("0", "1"), ("mcc",), 8551, header=False),
    GlueTask("SST-2", (0,), 1, ("0", "1"), ("accuracy",), 67349),
    GlueTask("MRPC", (3, 4), 0, ("0", "1"), ("f1", "accuracy"), 3668),
    GlueTask("QQP", (3, 4), 5, ("0", "1"), ("f1", "accuracy"), 363846),
    GlueTask("STS-B", (7, 8), -1, None, ("pearson", "spearman"), 5749),
    GlueTask("MNLI", (8, 9), -1, ("contradiction", "entailment", "neutral"), ("accuracy",),
             392702, dev_splits=("dev_matched", "dev_mismatched")),
    GlueTask("QNLI", (1, 2), -1, ("entailment", "not_entailment"), ("accuracy",), 104743),
    GlueTask("RTE", (1, 2), -1, ("entailment", "not_entailment"), ("accuracy",), 2490),
    GlueTask("WNLI", (1, 2), -1, ("0", "1"), ("accuracy",), 635),
]}


def get_task(name: str) -> GlueTask:
    for task in GLUE_TASKS.values():
        if name.lower().replace("-", "") == task.name.lower().replace("-", ""):
            return task
    raise ElectraUsageError(f"unknown GLUE task '{name}'; choose one of {', '.join(GLUE_TASKS)}")


def read_split(task: GlueTask, path: str, labelled: bool = True):
    """-> (list of sentence tuples, list of label strings or None) from an official TSV."""
    csv.field_size_limit(sys.maxsize)
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    except OSError as e:
        raise ElectraUsageError(f"cannot read {path}: {e.strerror}") from None
    if task.header and rows:
        rows = rows[1:]
    sentences, labels = [], []
    need = max(task.text_columns + (task.label_column if task.label_column >= 0 else 0,)) + 1
    for number, row in enumerate(rows, start=2 if task.header else 1):
        if len(row) < need:
            raise ElectraUsageError(
                f"{path}:{number} has {len(row)} tab-separated columns, {task.name} needs at "
                f"least {need}; is this the official GLUE file for {task.name}?")
        sentences.append(tuple(row[c] for c in task.text_columns))
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
