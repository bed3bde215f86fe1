"""Extractive question answering in SQuAD's format (1.1, and 2.0 with unanswerable
questions): answers decoded as the official code decodes them, judged by the official F1
and exact match."""

import os

from ...data import squad as sq
from ...data import squad_answers
from .base import Evaluation, FinetuningKind, HfHead, PreparedTask
from .registry import register_kind

METRICS = ("f1", "exact")  # the official evaluation's F1 and EM


@register_kind
class SquadKind(FinetuningKind):
    name = "squad"
    fairseq_task = "squad"
    criterion = "squad"
    prepare = ("electra-squad preprocess --pretrain-data PRETRAIN_DATA --train TRAIN.json "
               "--valid DEV.json --out-dir OUT_DIR")
    epochs = 2
    # SQuAD 1.1's plain head; 2.0's no-answer classifier has no transformers slot
    hf_head = HfHead("span_head", "ForQuestionAnswering", "squad", "squad")
    title = "SQuAD"

    def imported_task(self, data_dir, head_name, fields, labels):
        """squad 1.1: transformers' class is the plain span head."""
        return dict(_name=self.fairseq_task, data=os.path.abspath(data_dir),
                    classification_head_name=head_name, squad_version="1.1")

    def claims(self, name):
        return name.lower().startswith("squad")

    def data_problem(self, directory, splits=("train", "valid")):
        return sq.data_problem(directory, splits)

    def describe(self, directory, name):
        found = {}
        for split in ("train", "valid"):
            path = sq.split_paths(directory, split)["metadata"]
            if os.path.isfile(path):
                found[split] = sq.SquadMetadata.load(path)
        version = found["train"].version
        return PreparedTask(self.name, name, METRICS, None,
                            {s: len(m.examples) for s, m in found.items()},
                            {"version": version,
                             "windows": {s: len(m.windows) for s, m in found.items()}})

    def training_examples(self, task):
        """Windows, what an update's batch holds (recorded by :meth:`describe`)."""
        return task.details["windows"]["train"]

    def train_options(self, task, model_args):
        return ["--task", self.fairseq_task, "--criterion", self.criterion]

    def write_test_outputs(self, checkpoint, task_cfg, data, out_dir, cpu):
        """predictions.json ({question id: answer}, the official evaluation's input)."""
        import json

        from ...user_io.partial_output import written_whole
        from ..evaluate import squad_predictions

        preds, _ = squad_predictions(checkpoint, data, "test", cpu)
        path = os.path.join(out_dir, "predictions.json")
        os.makedirs(out_dir, exist_ok=True)
        with written_whole(path) as partial, open(partial, "w", encoding="utf-8") as f:
            json.dump({qid: p.answer for qid, p in preds.items()}, f, ensure_ascii=False)
        return [path]

    def evaluate(self, checkpoint, task, cpu):
        from ..evaluate import squad_predictions

        preds, meta = squad_predictions(checkpoint, task.directory, "valid", cpu)
        found = squad_answers.squad_scores(meta.examples,
                                           {qid: p.answer for qid, p in preds.items()})
        empty = squad_answers.squad_scores(meta.examples, {e.qid: "" for e in meta.examples})
        return Evaluation({task.name: {k: found[k] for k in METRICS}},
                          {task.name: {k: empty[k] for k in METRICS}})
