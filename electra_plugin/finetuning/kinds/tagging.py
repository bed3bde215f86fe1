"""Token tagging (NER, chunking, POS): a label per word from CoNLL files, judged by entity F1
(seqeval's, conlleval's counting) for BIO/BIOES labels and by accuracy for plain tags;
the result carries each entity type's precision, recall and F1."""

import os

from ...data import conll
from .base import Evaluation, FinetuningKind, HfHead, PreparedTask
from .registry import register_kind

ENTITY_METRICS = ("f1", "precision", "recall", "accuracy")


def count(directory, split):
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    return len(MMapIndexedDataset(os.path.join(directory, f"{split}.input")))


@register_kind
class TaggingKind(FinetuningKind):
    name = "tagging"
    fairseq_task = "token_tagging"
    criterion = "token_tagging"
    prepare = ("electra-tag preprocess --pretrain-data PRETRAIN_DATA --train TRAIN.conll "
               "--valid DEV.conll --out-dir OUT_DIR")
    hf_head = HfHead("token_head", "ForTokenClassification", "token_tagging", "tagging")
    title = "token tagging"

    def data_problem(self, directory, splits=("train", "valid")):
        return conll.data_problem(directory, splits)

    def describe(self, directory, name):
        with open(os.path.join(directory, conll.LABELS_FILE), encoding="utf-8") as f:
            labels = tuple(f.read().split())
        return PreparedTask(self.name, name, metrics_for(labels), labels,
                            {split: count(directory, split) for split in ("train", "valid")
                             if os.path.isfile(os.path.join(directory, f"{split}.input.idx"))})

    heads_from_checkpoint = False

    def imported_task(self, data_dir, head_name, fields, labels):
        """token_tagging over the import's directory, the class's tags as its labels.txt."""
        with open(os.path.join(data_dir, conll.LABELS_FILE), "w", encoding="utf-8") as f:
            f.write("".join(label + "\n" for label in labels))
        return dict(_name=self.fairseq_task, data=os.path.abspath(data_dir),
                    classification_head_name=head_name, max_positions=fields["max_positions"])

    def train_options(self, task, model_args):
        return ["--task", self.fairseq_task, "--criterion", self.criterion]

    def write_test_outputs(self, checkpoint, task_cfg, data, out_dir, cpu):
        """test.conll: each test word and its predicted label (CoNLL columns)."""
        from ...user_io.partial_output import written_whole
        from ..evaluate import tagging_predictions

        sentences, predicted, _ = tagging_predictions(checkpoint, data, "test", cpu)
        path = os.path.join(out_dir, "test.conll")
        os.makedirs(out_dir, exist_ok=True)
        with written_whole(path) as partial, open(partial, "w", encoding="utf-8") as f:
            for sentence, tags in zip(sentences, predicted):
                f.writelines(f"{word} {tag}\n" for word, tag in zip(sentence.words, tags))
                f.write("\n")
        return [path]

    def evaluate(self, checkpoint, task, cpu):
        from ..evaluate import tagging_predictions

        sentences, predicted, labels = tagging_predictions(checkpoint, task.directory,
                                                           "valid", cpu)
        gold = [s.labels for s in sentences]
        constant = "O" if "O" in labels else labels[0]
        keep = metrics_for(labels)
        scores = conll.tagging_scores(gold, predicted, labels)
        baseline = conll.tagging_scores(gold, [[constant] * len(g) for g in gold], labels)
        return Evaluation({task.name: {m: scores[m] for m in keep}},
                          {task.name: {m: baseline[m] for m in keep}},
                          {task.name: {"per_type": conll.per_type_scores(gold, predicted)}})


def metrics_for(labels) -> tuple:
    return ENTITY_METRICS if conll.is_entity_scheme(labels) else ("accuracy",)
