"""Multiple choice (SWAG, RACE, a JSONL of options): fairseq's sentence_ranking task scores
each option with a one-logit head; judged by accuracy."""

import os

from ...data import multiple_choice as mc
from .base import Evaluation, FinetuningKind, HfHead, PreparedTask
from .registry import register_kind


def labels_of(directory, split):
    path = os.path.join(directory, "label", f"{split}.label")
    with open(path, encoding="utf-8") as f:
        return [int(line) for line in f if line.strip()]


@register_kind
class ChoiceKind(FinetuningKind):
    name = "choice"
    fairseq_task = "sentence_ranking"
    criterion = "sentence_ranking"
    prepare = ("electra-choice preprocess --pretrain-data PRETRAIN_DATA --train TRAIN "
               "--valid DEV --out-dir OUT_DIR")
    hf_head = HfHead("choice_head", "ForMultipleChoice", "sentence_ranking",
                     "sentence_classification_head")
    title = "multiple-choice"
    dictionary_file = os.path.join("input0", "dict.txt")  # the text inputs' (fairseq's layout)

    def imported_task(self, data_dir, head_name, fields, labels):
        """sentence_ranking (fairseq's argparse task: a Namespace) with RoBERTa's tokens around
        the options; the number of options is left to the data."""
        from fairseq import options

        args = options.parse_args_and_arch(
            options.get_training_parser(default_task=self.fairseq_task),
            [os.path.abspath(data_dir), "--task", self.fairseq_task, "--criterion",
             self.criterion, "--arch", "electra", "--init-token", "0", "--separator-token",
             "2", "--ranking-head-name", head_name, "--max-positions",
             str(fields["max_positions"])])
        args._name = self.fairseq_task
        return args

    def data_problem(self, directory, splits=("train", "valid")):
        return mc.data_problem(directory, splits)

    def describe(self, directory, name):
        choices = mc.choices_in(directory)
        return PreparedTask(self.name, name, ("accuracy",), None,
                            {split: len(labels_of(directory, split)) for split in
                             ("train", "valid") if os.path.isfile(
                                 os.path.join(directory, "label", f"{split}.label"))},
                            {"choices": choices})

    def train_options(self, task, model_args):
        options = ["--task", self.fairseq_task, "--criterion", self.criterion,
                   "--num-classes", str(task.details["choices"]), "--init-token", "0",
                   "--separator-token", "2"]
        if "--max-positions" not in model_args:
            options += ["--max-positions", "512"]
        return options

    def chosen(self, checkpoint, data, split, cpu):
        """-> (the option each example of ``split`` gets, the gold ones or None)."""
        from ...data.evaluation import inference_device
        from ..evaluate import load_finetuned

        model, fairseq_task = load_finetuned(checkpoint, data, "sentence_ranking")
        device = inference_device(cpu)
        head = getattr(fairseq_task.args, "ranking_head_name", self.hf_head.head_name)
        scores, gold = mc.option_scores(model.to(device), fairseq_task, split, head, device)
        return scores.argmax(dim=1).tolist(), gold

    def write_test_outputs(self, checkpoint, task_cfg, data, out_dir, cpu):
        """test.choices: the chosen option's index (from 0), one example per line."""
        from ...user_io.partial_output import written_whole

        chosen, _ = self.chosen(checkpoint, data, "test", cpu)
        path = os.path.join(out_dir, "test.choices")
        os.makedirs(out_dir, exist_ok=True)
        with written_whole(path) as partial, open(partial, "w") as f:
            f.writelines(f"{c}\n" for c in chosen)
        return [path]

    def evaluate(self, checkpoint, task, cpu):
        chosen, gold = self.chosen(checkpoint, task.directory, "valid", cpu)
        accuracy = 100.0 * sum(c == g for c, g in zip(chosen, gold)) / len(gold)
        majority = 100.0 * max(gold.count(k) for k in set(gold)) / len(gold)
        return Evaluation({task.name: {"accuracy": accuracy}},
                          {task.name: {"accuracy": majority}})
