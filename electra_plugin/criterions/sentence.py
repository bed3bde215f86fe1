"""The sentence_prediction loss with the task's own dev metrics in fairseq's validation:
accuracy, F1 (of class 1, two classes) and MCC for classes, Pearson and Spearman for a
regression, computed as ``electra-glue evaluate`` computes them (data/glue.py's scikit-learn and
scipy calls), so ``--best-checkpoint-metric f1|mcc|pearson|spearman`` picks by them.

fairseq's own criterion reports them only behind flags and reads the labels back as
integers, which fails for a user's own label names (pos/neg); this one keeps class indices.
"""

import torch.nn.functional as F
from fairseq.criterions import register_criterion
from fairseq.criterions.sentence_prediction import (SentencePredictionConfig,
                                                    SentencePredictionCriterion)

from ..data.glue import METRICS
from .collected import collect, log_derived_scores

PAIRS = "_sentence_pairs"  # (prediction, gold) of every dev example
CLASS_METRICS = ("f1", "mcc")  # accuracy is fairseq's own count
REGRESSION_METRICS = ("pearson", "spearman")


def scores(pairs, names):
    pred, gold = [p for p, _ in pairs], [g for _, g in pairs]
    return {name: 100.0 * METRICS[name](pred, gold) for name in names}


@register_criterion("sentence_prediction_metrics", dataclass=SentencePredictionConfig)
class SentenceMetricsCriterion(SentencePredictionCriterion):
    """fairseq's loss (cross-entropy, or squared error for a regression) and accuracy; in
    validation also every example's prediction and gold label."""

    def forward(self, model, sample, reduce=True):
        logits, _ = model(**sample["net_input"], features_only=True,
                          classification_head_name=self.classification_head_name)
        gold = model.get_targets(sample, [logits]).view(-1)
        if self.regression_target:
            pred = logits.view(-1).float()
            loss = F.mse_loss(pred, gold.float(), reduction="sum")
        else:
            pred = logits.argmax(-1)
            loss = F.cross_entropy(logits.float(), gold, reduction="sum")
        log = {"loss": loss.detach(), "ntokens": sample["ntokens"], "nsentences": gold.numel(),
               "sample_size": gold.numel()}
        if not self.regression_target:
            log["ncorrect"] = (pred == gold).sum()
        if not model.training:
            log.update({PAIRS: list(zip(pred.tolist(), gold.tolist())),
                        "regression": self.regression_target, "classes": logits.size(-1)})
        return loss, gold.numel(), log

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        SentencePredictionCriterion.reduce_metrics(logging_outputs)
        if collect(PAIRS, logging_outputs):
            first = next(log for log in logging_outputs if PAIRS in log)
            regression = first["regression"]
            names = REGRESSION_METRICS if regression else \
                (CLASS_METRICS if first["classes"] == 2 else ("mcc",))
            log_derived_scores(PAIRS, lambda pairs: scores(pairs, names), names)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return False
