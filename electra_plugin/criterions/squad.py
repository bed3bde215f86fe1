"""The SQuAD loss: start/end cross-entropy (+ no-answer binary cross-entropy for 2.0)."""

from dataclasses import dataclass, field

import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass

from ..user_io.errors import ElectraUsageError

COUNTS = ("windows", "start_correct", "end_correct", "no_answer_windows", "no_answer_correct")


@dataclass
class SquadCriterionConfig(FairseqDataclass):
    no_answer_weight: float = field(
        default=0.5, metadata={"help": "weight of the no-answer loss, SQuAD 2.0 only "
                                       "(official ELECTRA answerable_weight: 0.5)"})


@register_criterion("squad", dataclass=SquadCriterionConfig)
class SquadCriterion(FairseqCriterion):
    """Per window: ``(CE(start) + CE(end)) / 2 [+ no_answer_weight * BCE(no answer)]``.

    CE is the cross-entropy of the start (end) logits over the window's non-pad positions
    against the target position, which is 0 (``<s>``) when the answer is not inside the
    window, as in the official BERT/ELECTRA code. For SQuAD 2.0 the no-answer classifier is
    trained with target 1 exactly for those windows. Losses are summed over the batch and
    ``sample_size`` is the number of windows, so the update averages over windows (whatever
    ``--update-freq`` and the number of workers); logged losses are per window, in nats.
    """

    def __init__(self, task, no_answer_weight):
        super().__init__(task)
        self.no_answer_weight = no_answer_weight
        self.head = task.cfg.classification_head_name
        self.pad = task.source_dictionary.pad()

    def forward(self, model, sample, reduce=True):
        if self.head not in getattr(model, "classification_heads", {}):
            raise ElectraUsageError(f"--criterion squad needs the model's span head "
                                    f"'{self.head}'; use it with --task squad")
        start_target, end_target = sample["target"].unbind(-1)
        # the gold start: what joint prediction conditions its end logits on in training
        logits, _ = model(**sample["net_input"], classification_head_name=self.head,
                          start_positions=start_target)
        # No host-device sync from here on: masks, sums and shapes, no indexing by values
        # (the model's encoder has one, its attention mask: models/core/encoder.py).
        padding = sample["net_input"]["src_tokens"].eq(self.pad)
        start = logits.start.float().masked_fill(padding, float("-inf"))
        end = logits.end.float().masked_fill(padding, float("-inf"))
        start_loss = F.cross_entropy(start, start_target, reduction="sum")
        end_loss = F.cross_entropy(end, end_target, reduction="sum")
        loss = (start_loss + end_loss) / 2
        windows = start_target.numel()
        no_answer = start_target.eq(0)
        log = {
            "start_loss": start_loss.detach(),
            "end_loss": end_loss.detach(),
            "windows": windows,
            "no_answer_windows": no_answer.sum(),
            "start_correct": (start.argmax(-1) == start_target).sum(),
            "end_correct": (end.argmax(-1) == end_target).sum(),
        }
        if logits.no_answer is not None:
            no_answer_loss = F.binary_cross_entropy_with_logits(
                logits.no_answer.float(), no_answer.float(), reduction="sum")
            loss = loss + self.no_answer_weight * no_answer_loss
            log["no_answer_loss"] = no_answer_loss.detach()
            log["no_answer_correct"] = ((logits.no_answer > 0) == no_answer).sum()
        log.update(loss=loss.detach(), ntokens=sample["ntokens"],
                   nsentences=sample["nsentences"], sample_size=windows)
        return loss, windows, log

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        """The sums stay tensors (no ``float()``, which would wait for the GPU every update),
        in float64, so they are the values Python floats gave. ``windows`` is an int (a
        tensor only after fairseq's all-reduce of several workers, itself a sync). The rates
        are computed only when fairseq reads the meters, where it calls ``.item()`` on every
        tensor meter anyway."""

        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        windows = total("sample_size")
        for key in ("loss", "start_loss", "end_loss", "no_answer_loss"):
            if any(key in log for log in logging_outputs):
                metrics.log_scalar(key, total(key).double() / max(windows, 1), windows,
                                   round=3)
        for key in COUNTS:
            metrics.log_scalar(f"_{key}", total(key))

        def rate(numer, denom="windows"):
            return lambda m: round(
                100 * float(m[f"_{numer}"].sum) / max(float(m[f"_{denom}"].sum), 1), 2)

        metrics.log_derived("start_acc", rate("start_correct"))
        metrics.log_derived("end_acc", rate("end_correct"))
        if any("no_answer_loss" in log for log in logging_outputs):
            metrics.log_derived("no_answer_acc", rate("no_answer_correct"))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
