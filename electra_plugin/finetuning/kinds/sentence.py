"""Sentence (pair) classification and regression: a GLUE task with the official recipe, or a
user's own set (electra-glue preprocess --text-columns ...) judged by accuracy, or by
Pearson/Spearman for scores. fairseq's sentence_prediction task trains it, with the
sentence_prediction_metrics criterion (the dev metrics in fairseq's validation)."""

import os
from typing import List, Sequence

from ...data.glue import GLUE_TASKS, GlueTask, constant_baseline, data_problem, score
from ...user_io.errors import ElectraUsageError
from .base import Evaluation, FinetuningKind, HfHead, PreparedTask
from .registry import register_kind

# official epochs: 3, 10 for RTE and STS-B (the paper's appendix)
GLUE_EPOCHS = {"RTE": 10, "STS-B": 10}


def own_metrics(labels) -> tuple:
    """A user's task: accuracy first; F1 of class 1 and MCC for two classes, MCC for more;
    Pearson then Spearman for a score."""
    if labels is None:
        return ("pearson", "spearman")
    return ("accuracy", "f1", "mcc") if len(labels) == 2 else ("accuracy", "mcc")


def glue_task(task: PreparedTask) -> GlueTask:
    """The table row of a GLUE task, or one made from a user task's record."""
    if task.name in GLUE_TASKS and task.details.get("glue", True):
        return GLUE_TASKS[task.name]
    inputs = int(task.details.get("inputs", 1))
    return GlueTask(task.name, tuple(range(inputs)), -1, task.labels, task.metrics,
                    task.counts.get("train", 0),
                    dev_splits=tuple(task.details.get("dev_splits", ("dev",))))


def counts(directory: str, splits: Sequence[str]) -> dict:
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    return {split: len(MMapIndexedDataset(os.path.join(directory, "input0", split)))
            for split in splits
            if os.path.isfile(os.path.join(directory, "input0", f"{split}.idx"))}


def layout(directory: str):
    """(inputs, labels or None) of a sentence_prediction directory."""
    inputs = 1 + os.path.isdir(os.path.join(directory, "input1"))
    label_dict = os.path.join(directory, "label", "dict.txt")
    labels = None
    if os.path.isfile(label_dict):
        with open(label_dict, encoding="utf-8") as f:
            labels = tuple(line.split()[0] for line in f if line.strip())
    return inputs, labels


@register_kind
class SentenceKind(FinetuningKind):
    name = "sentence"
    fairseq_task = "sentence_prediction"
    criterion = "sentence_prediction_metrics"
    prepare = ("electra-glue preprocess --task NAME --glue-dir DIR --pretrain-data "
               "PRETRAIN_DATA --out-dir OUT_DIR")
    hf_head = HfHead("classification_head", "ForSequenceClassification", "sentence_prediction",
                     "sentence_classification_head")
    title = "sentence classification"
    dictionary_file = os.path.join("input0", "dict.txt")  # the text inputs' (fairseq's layout)

    def data_problem(self, directory, splits=("train", "valid")):
        inputs, labels = layout(directory)
        regression = labels is None and os.path.isfile(
            os.path.join(directory, "label", "train.label"))
        shape = GlueTask("sentences", tuple(range(inputs)), -1,
                         None if regression else (labels or ("?",)), ("accuracy",), 0)
        return data_problem(shape, directory, list(splits))

    def claims(self, name):
        return name in GLUE_TASKS

    def name_problem(self, name, directory):
        """A GLUE task's data as GLUE's table has it: its inputs, its classes in order."""
        return data_problem(GLUE_TASKS[name], directory)

    def making(self, name):
        if name in GLUE_TASKS:
            return (f"electra-glue preprocess --task {name} --glue-dir GLUE_DIR/{name} "
                    f"--pretrain-data PRETRAIN_DATA --out-dir DIR")
        return super().making(name)

    def describe(self, directory, name):
        inputs, labels = layout(directory)
        if name in GLUE_TASKS:
            glue = GLUE_TASKS[name]
            return PreparedTask(self.name, glue.name, glue.metrics, glue.labels,
                                counts(directory, ["train", "valid"]),
                                {"inputs": inputs, "dev_splits": list(glue.dev_splits)})
        return PreparedTask(self.name, name, own_metrics(labels), labels,
                            counts(directory, ["train", "valid"]),
                            {"inputs": inputs, "glue": False})

    def training_epochs(self, task):
        return GLUE_EPOCHS.get(task.name, self.epochs) if task.details.get("glue", True) \
            else self.epochs

    def train_options(self, task, model_args) -> List[str]:
        glue = glue_task(task)
        options = ["--task", self.fairseq_task, "--criterion", self.criterion,
                   "--num-classes", str(glue.num_classes), "--init-token", "0",
                   "--shorten-method", "truncate"]
        if "--max-positions" not in model_args:  # the task's and the model's option
            options += ["--max-positions", "512"]
        return options + (["--regression-target"] if glue.labels is None else [])

    def dev_rows(self, task: PreparedTask) -> dict:
        """{row: fairseq split} (MNLI: matched and mismatched)."""
        names = glue_task(task).dev_splits
        if len(names) == 1:
            return {task.name: "valid"}
        return {task.name: "valid", **{f"{task.name}-mm": f"valid{i}"
                                       for i in range(1, len(names))}}

    def write_test_outputs(self, checkpoint, task_cfg, data, out_dir, cpu):
        """The GLUE server's files (RTE.tsv, MNLI-m.tsv, AX.tsv ...)."""
        from ..glue_server_files import write_glue_test_outputs

        return write_glue_test_outputs(checkpoint, task_cfg, data, out_dir, cpu)

    def evaluate(self, checkpoint, task, cpu):
        from ..evaluate import sentence_predictions

        glue, rows = glue_task(task), self.dev_rows(task)
        predicted = sentence_predictions(checkpoint, task.directory, list(rows.values()), cpu)
        result = Evaluation({}, {})
        for row, split in rows.items():
            preds, gold = predicted[split]
            if gold is None:
                raise ElectraUsageError(f"the {split} split of {task.directory} has no labels; "
                                        f"trials need a labelled dev set")
            result.scores[row] = score(glue, preds, gold)
            result.baselines[row] = constant_baseline(glue, gold)
        return result
