"""The ``token_tagging`` task: a label per word (NER, chunking, POS) from the data that
``electra-tag preprocess`` writes (``{split}.input``, ``{split}.target``,
``{split}.tagging.json``, ``labels.txt``)."""

import logging
import os
from dataclasses import dataclass, field

from fairseq.data import (IdDataset, NestedDictionaryDataset, NumelDataset, NumSamplesDataset,
                          RightPadDataset, data_utils)
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II, MISSING

from ..data.conll import IGNORE, LABELS_FILE
from ..data.dictionary import MASK_SYMBOL, load_dictionary
from ..data.shuffle import EpochShuffleDataset
from ..models.core.heads import ElectraTokenClassificationHead
from ..optim.amp import optimizer_step
from ..user_io.errors import ElectraUsageError
from .electra_pretraining import load_split

logger = logging.getLogger(__name__)


@dataclass
class TaggingConfig(FairseqDataclass):
    data: str = field(
        default=MISSING, metadata={"help": "directory written by electra-tag preprocess"})
    classification_head_name: str = field(
        default="tagging", metadata={"help": "name of the token head in the model"})
    max_positions: int = field(
        default=512, metadata={"help": "longest input; electra-tag preprocess cut the "
                                       "sentences to its --max-seq-len"})
    seed: int = II("common.seed")


@register_task("token_tagging", dataclass=TaggingConfig)
class TaggingTask(FairseqTask):
    """A batch holds ``net_input.src_tokens`` (B x T: ``<s> pieces </s>``) and ``target``
    (B x T: the word's label on its first piece, -1 on the other pieces, the specials and
    padding)."""

    cfg: TaggingConfig

    def __init__(self, cfg: TaggingConfig, dictionary, labels):
        super().__init__(cfg)
        self.dictionary = dictionary
        dictionary.add_symbol(MASK_SYMBOL)  # the pre-training vocabulary, <mask> included
        self.labels = labels

    @classmethod
    def setup_task(cls, cfg: TaggingConfig, **kwargs):
        path = os.path.join(cfg.data, LABELS_FILE)
        if not os.path.isfile(path):
            raise ElectraUsageError(f"{cfg.data} has no {LABELS_FILE}; make tagging data "
                                    f"with electra-tag preprocess")
        with open(path, encoding="utf-8") as f:
            labels = f.read().split()
        return cls(cfg, load_dictionary(cfg.data), labels)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        tokens = load_split(self.cfg.data, f"{split}.input", self.dictionary, combine=False)
        targets = data_utils.load_indexed_dataset(
            os.path.join(self.cfg.data, f"{split}.target"), None)
        if targets is None or len(targets) != len(tokens):
            raise ElectraUsageError(f"the '{split}' split in {self.cfg.data} is incomplete "
                                    f"({split}.input and {split}.target disagree); run "
                                    f"electra-tag preprocess again")
        dataset = NestedDictionaryDataset(
            {
                "id": IdDataset(),
                "net_input": {"src_tokens": RightPadDataset(tokens, self.dictionary.pad())},
                "target": RightPadDataset(targets, pad_idx=IGNORE),
                "nsentences": NumSamplesDataset(),
                "ntokens": NumelDataset(tokens, reduce=True),
            },
            sizes=[tokens.sizes],
        )
        self.datasets[split] = EpochShuffleDataset(dataset, tokens.sizes, self.cfg.seed)
        logger.info(f"{split}: {len(dataset)} sentences, {len(self.labels)} labels")
        return self.datasets[split]

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if not hasattr(model, "add_head"):
            raise ElectraUsageError("--task token_tagging needs an ELECTRA model "
                                    "(--arch electra_*)")
        settings = model.head_settings()
        model.add_head(self.cfg.classification_head_name, ElectraTokenClassificationHead(
            settings.hidden_size, len(self.labels), settings.dropout, settings.transform))
        return model

    def optimizer_step(self, optimizer, model, update_num):
        optimizer_step(optimizer)  # --amp: unscaled once (optim/amp.py)

    def max_positions(self):
        return self.cfg.max_positions

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
