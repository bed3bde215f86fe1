"""The ``squad`` task: extractive question answering (SQuAD v1.1 / v2.0) on the discriminator.

Data comes from ``electra-squad preprocess`` (see ``electra_plugin.data.squad``): a
directory with the pre-training ``dict.txt`` and, per split, ``{split}.input`` (token ids of
``<s> question </s> context-window </s>``), ``{split}.target`` (start, end) and
``{split}.squad.json`` (the metadata that maps predictions back to text).
"""

import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
from fairseq.data import (
    BaseWrapperDataset,
    IdDataset,
    NestedDictionaryDataset,
    NumelDataset,
    NumSamplesDataset,
    RawLabelDataset,
    RightPadDataset,
    data_utils,
)
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II, MISSING

from ..criterions.collected import collect, log_derived_scores
from ..data import squad_answers
from ..data.dictionary import MASK_SYMBOL, load_dictionary
from ..data.evaluation import batch_window_logits
from ..data.shuffle import EpochShuffleDataset
from ..data.squad import SquadMetadata, split_paths
from ..models.core.span_head import SpanHead
from ..optim.amp import optimizer_step
from ..user_io.errors import ElectraUsageError
from .electra_pretraining import load_split

logger = logging.getLogger(__name__)
WINDOWS = "_squad_windows"  # (split, window id, WindowLogits) of every dev window


@dataclass
class SquadConfig(FairseqDataclass):
    data: str = field(
        default=MISSING,
        metadata={"help": "directory written by electra-squad preprocess (dict.txt, "
                          "{split}.input/.target .bin/.idx, {split}.squad.json)"})
    squad_version: Optional[ChoiceEnum(["1.1", "2.0"])] = field(  # type: ignore
        default=None,
        metadata={"help": "SQuAD version; 2.0 adds the no-answer classifier and its loss. "
                          "Default: the version the data was preprocessed as (a different "
                          "value is an error)"})
    classification_head_name: str = field(
        default="squad", metadata={"help": "name of the span head in the model"})
    # the official ELECTRA head and decoding (configure_finetuning.py); off: BERT's one
    # linear layer, which transformers' ElectraForQuestionAnswering serves
    joint_prediction: bool = field(
        default=False, metadata={"help": "end logits conditioned on the start (official "
                                         "joint_prediction): trained on the gold start, "
                                         "decoded by a beam over starts, then ends"})
    beam_size: int = field(
        default=20, metadata={"help": "starts, and ends per start, the joint decoding "
                                      "keeps (official beam_size)"})
    answerable_uses_start_logits: bool = field(
        default=False, metadata={"help": "SQuAD 2.0: the no-answer classifier also reads "
                                         "the features averaged under the start "
                                         "probabilities (official "
                                         "answerable_uses_start_logits)"})
    max_seq_len: Optional[int] = field(
        default=None,
        metadata={"help": "longest window, in tokens; fixed when the data is preprocessed "
                          "(--max-seq-len there) and read from it by default. Must not exceed "
                          "the model's --max-positions"})
    seed: int = II("common.seed")


class SegmentIdsDataset(BaseWrapperDataset):
    """Token types: 0 for ``<s> question </s>``, 1 for ``context </s>`` (BERT's segments)."""

    def __init__(self, dataset, eos):
        super().__init__(dataset)
        self.eos = eos

    def __getitem__(self, index):
        tokens = self.dataset[index]
        types = torch.zeros_like(tokens)
        first_eos = int(tokens.eq(self.eos).nonzero()[0])
        types[first_eos + 1:] = 1
        return types


@register_task("squad", dataclass=SquadConfig)
class SquadTask(FairseqTask):
    """Span extraction: batches of windows with (start, end) targets.

    A batch holds ``net_input.src_tokens`` and ``net_input.token_types`` (B x T), ``target``
    (B x 2: start and end position; 0, the ``<s>`` token, when the window holds no answer)
    and ``id`` (the window's index in ``{split}.squad.json``), and ``split`` (which split,
    for the dev metric). Validation logs the official EM and F1 (``exact``, ``f1``) of the
    answers decoded as ``electra-squad predict`` decodes them (no-answer threshold 0).
    """

    cfg: SquadConfig

    def __init__(self, cfg: SquadConfig, dictionary, metadata: dict):
        super().__init__(cfg)
        self.dictionary = dictionary
        # Same dictionary (and vocabulary size) as the electra pre-training task.
        dictionary.add_symbol(MASK_SYMBOL)
        self.data_version = metadata["version"]
        self.data_max_seq_len = metadata["max_seq_len"]
        self.metadata = {}
        self.split_names = []  # a sample's ``split`` indexes this

    @classmethod
    def setup_task(cls, cfg: SquadConfig, **kwargs):
        dictionary = load_dictionary(cfg.data)
        splits = sorted(f[:-len(".squad.json")] for f in os.listdir(cfg.data)
                        if f.endswith(".squad.json"))
        if not splits:
            raise ElectraUsageError(f"{cfg.data} has no SQuAD data ({{split}}.squad.json); "
                                    f"make it with electra-squad preprocess")
        first = SquadMetadata.load(os.path.join(cfg.data, splits[0] + ".squad.json"))
        meta = {"version": first.version, "max_seq_len": first.max_seq_len}
        if cfg.squad_version is not None and str(cfg.squad_version) != first.version:
            raise ElectraUsageError(f"--squad-version {cfg.squad_version} but {cfg.data} was "
                                    f"preprocessed as SQuAD {first.version}")
        if cfg.max_seq_len is not None and cfg.max_seq_len < first.max_seq_len:
            raise ElectraUsageError(
                f"--max-seq-len {cfg.max_seq_len} but {cfg.data} was preprocessed with windows "
                f"of up to {first.max_seq_len} tokens; preprocess again with --max-seq-len "
                f"{cfg.max_seq_len}")
        return cls(cfg, dictionary, meta)

    @property
    def version(self) -> str:
        return self.data_version

    @property
    def answerable(self) -> bool:
        """Whether the model has a no-answer classifier (SQuAD 2.0)."""
        return self.version == "2.0"

    def load_metadata(self, split) -> SquadMetadata:
        if split not in self.metadata:
            path = split_paths(self.cfg.data, split)["metadata"]
            if not os.path.isfile(path):
                raise ElectraUsageError(
                    f"no '{split}' split in {self.cfg.data} ({os.path.basename(path)}); "
                    f"preprocess it with electra-squad preprocess (--train/--valid/--test) "
                    f"or choose another --valid-subset / --disable-validation")
            meta = SquadMetadata.load(path)
            if meta.version != self.version or meta.max_seq_len > self.max_positions():
                raise ElectraUsageError(
                    f"the '{split}' split in {self.cfg.data} was preprocessed as SQuAD "
                    f"{meta.version} with --max-seq-len {meta.max_seq_len}, unlike the other "
                    f"splits (SQuAD {self.version}, {self.max_positions()})")
            self.metadata[split] = meta
        return self.metadata[split]

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = split_paths(self.cfg.data, split)
        meta = self.load_metadata(split)
        tokens = load_split(self.cfg.data, os.path.basename(paths["input"]), self.dictionary,
                            combine=False)
        targets = data_utils.load_indexed_dataset(paths["target"], None)
        if targets is None or len(targets) != len(tokens) or len(tokens) != len(meta.windows):
            raise ElectraUsageError(
                f"the '{split}' split in {self.cfg.data} is incomplete or inconsistent "
                f"({split}.input, {split}.target and {split}.squad.json disagree); run "
                f"electra-squad preprocess again")
        labels = np.stack([targets[i].numpy() for i in range(len(targets))])  # N x 2
        if split not in self.split_names:
            self.split_names.append(split)
        pad = self.dictionary.pad()
        dataset = NestedDictionaryDataset(
            {
                "id": IdDataset(),
                "net_input": {
                    "src_tokens": RightPadDataset(tokens, pad_idx=pad),
                    "token_types": RightPadDataset(
                        SegmentIdsDataset(tokens, self.dictionary.eos()), pad_idx=0),
                    "src_lengths": NumelDataset(tokens, reduce=False),
                },
                "target": RawLabelDataset(labels.tolist()),
                "split": RawLabelDataset([self.split_names.index(split)] * len(tokens)),
                "nsentences": NumSamplesDataset(),
                "ntokens": NumelDataset(tokens, reduce=True),
            },
            sizes=[tokens.sizes],
        )
        self.datasets[split] = EpochShuffleDataset(dataset, tokens.sizes, self.cfg.seed)
        logger.info(f"{split}: {len(dataset)} windows of {len(meta.examples)} questions "
                    f"(SQuAD {meta.version})")
        return self.datasets[split]

    def build_model(self, cfg, from_checkpoint=False):
        positions = getattr(cfg, "max_positions", None)
        if positions is not None and self.max_positions() > positions:
            raise ElectraUsageError(
                f"the SQuAD windows in {self.cfg.data} are up to {self.max_positions()} tokens "
                f"long (--max-seq-len of electra-squad preprocess) but the model has "
                f"{positions} positions (--max-positions); preprocess again with --max-seq-len "
                f"{positions} or less")
        model = super().build_model(cfg, from_checkpoint)
        if not hasattr(model, "add_head"):
            raise ElectraUsageError("--task squad needs an ELECTRA model (--arch electra_*)")
        if self.cfg.beam_size < 1:
            raise ElectraUsageError(f"--beam-size {self.cfg.beam_size}: give 1 or more")
        if self.cfg.answerable_uses_start_logits and not self.answerable:
            raise ElectraUsageError("--answerable-uses-start-logits is for SQuAD 2.0's "
                                    "no-answer classifier; this data is SQuAD 1.1")
        settings = model.head_settings()
        model.add_head(self.cfg.classification_head_name, SpanHead(
            settings.hidden_size, self.answerable, settings.dropout,
            joint_prediction=self.cfg.joint_prediction, beam_size=self.cfg.beam_size,
            answerable_uses_start_logits=self.cfg.answerable_uses_start_logits,
            transform=settings.transform))
        return model

    def valid_step(self, sample, model, criterion):
        """The loss, and each window's logits as the answer decoding reads them."""
        loss, sample_size, log = super().valid_step(sample, model, criterion)
        split = self.split_names[int(sample["split"][0])]
        with torch.no_grad():
            windows = batch_window_logits(model, sample, self.cfg.classification_head_name,
                                          sample["net_input"]["src_tokens"].device)
        log[WINDOWS] = [(split, w, logits) for w, logits in windows.items()]
        return loss, sample_size, log

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        if collect(WINDOWS, logging_outputs):
            log_derived_scores(WINDOWS, self.dev_scores, ("exact", "f1"))

    def logging_outputs_can_be_summed(self, criterion) -> bool:
        return False  # the windows' logits (criterions/collected.py)

    def dev_scores(self, windows):
        """Official EM/F1 of the questions whose windows were all validated."""
        split = windows[0][0]
        meta = self.load_metadata(split)
        predicted = squad_answers.predict_answers(
            meta, {w: logits for _, w, logits in windows}, partial=True)
        examples = [e for e in meta.examples if e.qid in predicted]
        if not examples:
            return {}
        return squad_answers.squad_scores(
            examples, {qid: p.answer for qid, p in predicted.items()})

    def optimizer_step(self, optimizer, model, update_num):
        optimizer_step(optimizer)  # --amp: unscaled once (optim/amp.py)

    def max_positions(self):
        return self.cfg.max_seq_len or self.data_max_seq_len

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
