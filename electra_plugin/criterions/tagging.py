"""The tagging loss: cross-entropy of each word's label at its first piece."""

import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass

from ..data.conll import IGNORE
from ..errors import ElectraUsageError


# with a dataclass (even an empty one) the checkpoint's config stays plain containers; without
# one fairseq stores an argparse.Namespace, which the safe loader refuses
@register_criterion("token_tagging", dataclass=FairseqDataclass)
class TaggingCriterion(FairseqCriterion):
    """Cross-entropy summed over the labelled pieces (a word's first; the others, the
    specials and padding have target -1); ``sample_size`` is the number of labelled words,
    so an update averages over words whatever ``--update-freq`` and the workers."""

    def __init__(self, task):
        super().__init__(task)
        self.head = task.cfg.classification_head_name

    def forward(self, model, sample, reduce=True):
        if self.head not in getattr(model, "classification_heads", {}):
            raise ElectraUsageError(f"--criterion token_tagging needs the model's token head "
                                    f"'{self.head}'; use it with --task token_tagging")
        logits, _ = model(**sample["net_input"], classification_head_name=self.head)
        target = sample["target"]
        labelled = target.ne(IGNORE)
        loss = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(),
                               ignore_index=IGNORE, reduction="sum")
        words = labelled.sum()
        correct = (logits.argmax(-1).eq(target) & labelled).sum()
        return loss, words, {"loss": loss.detach(), "words": words, "correct": correct,
                             "ntokens": sample["ntokens"], "nsentences": sample["nsentences"],
                             "sample_size": words}

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        words = total("words")
        metrics.log_scalar("loss", total("loss") / max(float(words), 1), words, round=3)
        metrics.log_scalar("_words", words)
        metrics.log_scalar("_correct", total("correct"))
        metrics.log_derived("accuracy", lambda m: round(
            100 * float(m["_correct"].sum) / max(float(m["_words"].sum), 1), 2))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
