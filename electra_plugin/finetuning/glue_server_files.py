"""The sentence kind's test-set writer: a fine-tuned checkpoint's predictions on a GLUE task's
unlabelled test splits, in the files the GLUE server scores: one ``index<TAB>prediction`` TSV
per split (RTE.tsv, MNLI-m.tsv, MNLI-mm.tsv, AX.tsv ...), the labels as the task's files spell
them, STS-B scores clipped to the 0-5 scale."""

import json
import os
from typing import List

from ..data.glue import TEST_OUTPUTS, GlueTask, get_task
from ..user_io.errors import ElectraUsageError
from ..user_io.partial_output import written_whole
from .evaluate import sentence_predictions

STS_RANGE = (0.0, 5.0)


def write_glue_test_outputs(checkpoint, task_cfg, data, out_dir, cpu=False) -> List[str]:
    """Predict every test split ``electra-glue preprocess`` binarized into ``data`` and write
    its server file into ``out_dir``; -> the paths written."""
    spec_path = os.path.join(data, TEST_OUTPUTS)
    if not os.path.isfile(spec_path):
        raise ElectraUsageError(
            f"{data} holds no test split ({TEST_OUTPUTS} is missing); preprocess the task "
            f"with electra-glue preprocess from a directory that has its test TSV(s)")
    with open(spec_path) as f:
        spec = json.load(f)
    task = get_task(spec["task"])
    check_outputs(checkpoint, task_cfg, task)
    os.makedirs(out_dir, exist_ok=True)
    written = []
    predicted = sentence_predictions(checkpoint, data, list(spec["splits"]), cpu)
    for split, entry in spec["splits"].items():
        preds, _ = predicted[split]
        ids = entry["ids"]
        if len(preds) != len(ids):
            raise ElectraUsageError(f"{split} of {data} has {len(preds)} examples but "
                                    f"{TEST_OUTPUTS} lists {len(ids)} ids; preprocess it again")
        if task.labels is None:
            values = [f"{min(max(p, STS_RANGE[0]), STS_RANGE[1]):.3f}" for p in preds]
        else:
            values = [task.labels[p] for p in preds]
        path = os.path.join(out_dir, entry["server_file"])
        with written_whole(path) as partial, open(partial, "w", encoding="utf-8") as f:
            f.write("index\tprediction\n")
            f.writelines(f"{i}\t{v}\n" for i, v in zip(ids, values))
        written.append(path)
    return written


def check_outputs(checkpoint, task_cfg, task: GlueTask) -> None:
    """A sentence_prediction checkpoint predicts what ``task``'s server file holds: its
    number of classes, or a score for a regression task."""
    regression = bool(task_cfg.get("regression_target", False))
    classes = task_cfg.get("num_classes", None)
    if regression == (task.labels is None) and (regression or classes == task.num_classes):
        return
    predicts = "a score (--regression-target)" if regression else f"{classes} classes"
    needs = "a score" if task.labels is None else f"{task.num_classes} classes"
    raise ElectraUsageError(f"--checkpoint {checkpoint} predicts {predicts}; {task.name} needs "
                            f"{needs}: give a checkpoint fine-tuned on {task.name}")
