"""A fine-tuning kind of one's own, from a --user-dir module: a score for every token (a
regression head on tokens), judged by Pearson's r. Everything it needs is in this one file:
its data writer, fairseq task, criterion, head and kind; the plugin is not edited.
tests/test_kinds.py runs it through trials, evaluation and export."""

import json
import os
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.data import (IdDataset, NestedDictionaryDataset, NumelDataset, NumSamplesDataset,
                          RightPadDataset, data_utils, indexed_dataset)
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import MISSING

from electra_plugin.data.dictionary import load_dictionary
from electra_plugin.data.glue import pearson
from electra_plugin.data.tokenizer import load_tokenizer
from electra_plugin.finetuning.kinds import (Evaluation, FinetuningKind, PreparedTask,
                                             record_task, register_kind)
from electra_plugin.user_io.output_dir import lacks

PAD_SCORE = -100.0  # the target of <s>, </s> and padding: not scored


def prepare(pretrain_data, out_dir, splits):
    """{split: [sentence, ...]} -> the kind's data: each piece scored 1 if it starts a word."""
    os.makedirs(out_dir, exist_ok=True)
    dictionary, tokenizer = load_dictionary(pretrain_data), load_tokenizer(pretrain_data)
    with open(os.path.join(pretrain_data, "dict.txt")) as f:
        open(os.path.join(out_dir, "dict.txt"), "w").write(f.read())
    for split, sentences in splits.items():
        prefix = os.path.join(out_dir, f"{split}.input")
        builder = indexed_dataset.make_builder(prefix + ".bin", "mmap",
                                               vocab_size=len(dictionary))
        scores = []
        for text in sentences:
            pieces = tokenizer.pieces(text)
            ids = [dictionary.bos()] + [dictionary.index(p) for p in pieces] + [dictionary.eos()]
            builder.add_item(torch.IntTensor(ids))
            scores.append([PAD_SCORE] + [float(p.startswith("\u2581")) for p in pieces]
                          + [PAD_SCORE])
        builder.finalize(prefix + ".idx")
        with open(os.path.join(out_dir, f"{split}.scores.json"), "w") as f:
            json.dump(scores, f)
    record_task("token_scores", out_dir)


class ScoresDataset(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __getitem__(self, index):
        return torch.tensor(self.rows[index])

    def __len__(self):
        return len(self.rows)


@dataclass
class TokenScoresConfig(FairseqDataclass):
    data: str = field(default=MISSING, metadata={"help": "the directory prepare() wrote"})


@register_task("token_scores", dataclass=TokenScoresConfig)
class TokenScoresTask(FairseqTask):
    def __init__(self, cfg, dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary
        dictionary.add_symbol("<mask>")

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        return cls(cfg, load_dictionary(cfg.data))

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        tokens = data_utils.load_indexed_dataset(
            os.path.join(self.cfg.data, f"{split}.input"), self.dictionary)
        with open(os.path.join(self.cfg.data, f"{split}.scores.json")) as f:
            scores = ScoresDataset(json.load(f))
        self.datasets[split] = NestedDictionaryDataset(
            {"id": IdDataset(),
             "net_input": {"src_tokens": RightPadDataset(tokens, self.dictionary.pad())},
             "target": RightPadDataset(scores, pad_idx=PAD_SCORE),
             "nsentences": NumSamplesDataset(), "ntokens": NumelDataset(tokens, reduce=True)},
            sizes=[tokens.sizes])
        return self.datasets[split]

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        settings = model.head_settings()
        model.add_head("scores", TokenScoreHead(settings.hidden_size))
        return model

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary


class TokenScoreHead(nn.Module):
    """One linear layer: a score per token."""

    def __init__(self, hidden_size):
        super().__init__()
        self.out_proj = nn.Linear(hidden_size, 1)

    def forward(self, features, **_):
        return self.out_proj(features).squeeze(-1)


@register_criterion("token_scores", dataclass=FairseqDataclass)
class TokenScoresCriterion(FairseqCriterion):
    def forward(self, model, sample, reduce=True):
        predicted, _ = model(**sample["net_input"], classification_head_name="scores")
        target = sample["target"]
        scored = target.ne(PAD_SCORE)
        loss = F.mse_loss(predicted.float()[scored], target[scored], reduction="sum")
        n = scored.sum()
        return loss, n, {"loss": loss.detach(), "sample_size": n,
                         "ntokens": sample["ntokens"], "nsentences": sample["nsentences"]}

    @staticmethod
    def reduce_metrics(logging_outputs):
        n = sum(log["sample_size"] for log in logging_outputs)
        metrics.log_scalar("loss", sum(log["loss"] for log in logging_outputs) / max(n, 1), n)

    @staticmethod
    def logging_outputs_can_be_summed():
        return True


@register_kind
class TokenScoresKind(FinetuningKind):
    name = "token_scores"
    title = "token scores"
    fairseq_task = "token_scores"
    criterion = "token_scores"
    prepare = "token_scores.prepare(PRETRAIN_DATA, OUT_DIR, splits)"

    def data_problem(self, directory, splits=("train", "valid")):
        return lacks(directory, ["dict.txt"] + [f"{s}.{e}" for s in splits
                                                for e in ("input.bin", "input.idx",
                                                          "scores.json")])

    def describe(self, directory, name):
        counts = {}
        for split in ("train", "valid"):
            path = os.path.join(directory, f"{split}.scores.json")
            if os.path.isfile(path):
                with open(path) as f:
                    counts[split] = len(json.load(f))
        return PreparedTask(self.name, name, ("pearson", "mse"), None, counts)

    def train_options(self, task, model_args):
        return ["--task", self.fairseq_task, "--criterion", self.criterion]

    def evaluate(self, checkpoint, task, cpu):
        from fairseq import checkpoint_utils

        models, _, fairseq_task = checkpoint_utils.load_model_ensemble_and_task(
            [checkpoint], arg_overrides={"data": task.directory})
        model = models[0].eval()
        dataset = fairseq_task.load_dataset("valid")
        predicted, gold = [], []
        with torch.no_grad():
            for i in range(len(dataset)):
                sample = dataset.collater([dataset[i]])
                out, _ = model(**sample["net_input"], classification_head_name="scores")
                keep = sample["target"].ne(PAD_SCORE)
                predicted += out[keep].tolist()
                gold += sample["target"][keep].tolist()
        mse = float(np.mean((np.array(predicted) - np.array(gold)) ** 2))
        constant = float(np.mean((np.mean(gold) - np.array(gold)) ** 2))
        return Evaluation({task.name: {"pearson": 100 * pearson(predicted, gold), "mse": mse}},
                          {task.name: {"pearson": 0.0, "mse": constant}})
