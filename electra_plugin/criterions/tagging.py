"""The tagging loss: cross-entropy of each word's label at its first piece."""

import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass

from ..data.conll import IGNORE, is_entity_scheme, tagging_scores
from ..user_io.errors import ElectraUsageError
from .collected import collect, log_derived_scores

SENTENCES = "_tagged_sentences"  # (gold labels, predicted labels) of every dev sentence


# with a dataclass (even an empty one) the checkpoint's config stays plain containers; without
# one fairseq stores an argparse.Namespace, which the safe loader refuses
@register_criterion("token_tagging", dataclass=FairseqDataclass)
class TaggingCriterion(FairseqCriterion):
    """Cross-entropy summed over the labelled pieces (a word's first; the others, the
    specials and padding have target -1); ``sample_size`` is the number of labelled words,
    so an update averages over words whatever ``--update-freq`` and the workers. Validation
    also logs the entity F1, precision and recall (seqeval's, as ``electra-tag predict``)
    for BIO/BIOES labels, over the words inside ``--max-seq-len``."""

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
        predicted = logits.argmax(-1)
        correct = (predicted.eq(target) & labelled).sum()
        log = {"loss": loss.detach(), "words": words, "correct": correct,
               "ntokens": sample["ntokens"], "nsentences": sample["nsentences"],
               "sample_size": words}
        if not model.training:
            labels = self.task.labels
            log[SENTENCES] = [
                ([labels[i] for i in gold[keep].tolist()], [labels[i] for i in pred[keep].tolist()])
                for gold, pred, keep in zip(target.cpu(), predicted.cpu(), labelled.cpu())]
        return loss, words, log

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
        batch = [s for log in logging_outputs for s in log.get(SENTENCES, ())]
        if collect(SENTENCES, logging_outputs) and \
                is_entity_scheme({label for gold, _ in batch for label in gold}):
            log_derived_scores(SENTENCES, sentence_scores, ("f1", "precision", "recall"))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return False


def sentence_scores(sentences) -> dict:
    """Entity scores of (gold, predicted) label lists; none for tags that are not chunks."""
    gold, predicted = [g for g, _ in sentences], [p for _, p in sentences]
    seen = sorted({label for labels in gold + predicted for label in labels})
    return tagging_scores(gold, predicted, seen)
