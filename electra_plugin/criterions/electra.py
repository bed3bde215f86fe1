"""The ELECTRA loss: generator MLM loss + lambda * discriminator replaced-token loss."""

import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass

from ..flops import model_sizes, paper_train_flops

# Counts each batch logs; summed over micro-batches and workers, then turned into rates.
COUNTS = ("masked", "tokens", "replaced", "predicted_replaced", "true_replaced",
          "gen_correct", "disc_correct")


@dataclass
class ElectraCriterionConfig(FairseqDataclass):
    disc_weight: float = field(
        default=50.0, metadata={"help": "lambda, the weight of the discriminator loss "
                                        "(official: 50)"})


@register_criterion("electra", dataclass=ElectraCriterionConfig)
class ElectraCriterion(FairseqCriterion):
    """``L = L_MLM + disc_weight * L_Disc`` for one batch.

    ``L_MLM`` is the generator's cross-entropy averaged over the masked positions, ``L_Disc``
    the discriminator's binary cross-entropy averaged over all non-pad tokens (targets:
    1 = replaced). Both are per-batch means, as in the official code, so ``sample_size`` is 1
    per batch: with ``--update-freq k`` or k workers the update averages the k batch losses.

    Training batches also log their FLOPs as the paper counts them (:mod:`..flops`, with
    the batch's own length and number of masked positions); each update adds their sum over
    micro-batches and workers to the model's :class:`~electra_plugin.flops.FlopsCounter`,
    and every log line shows the running total as ``train_flops``, so that runs can be
    compared at equal compute (the ``wall`` column gives the time it took).
    """

    # The FLOPs counter of the model the latest training batch ran on. fairseq calls
    # reduce_metrics on the class, after it has summed the logging outputs of all
    # micro-batches and workers; that is where an update's FLOPs are known, so it adds them
    # to this counter.
    _counter = None

    def __init__(self, task, disc_weight):
        super().__init__(task)
        self.disc_weight = disc_weight

    def forward(self, model, sample, reduce=True):
        out = model(**sample["net_input"], target=sample["target"])
        # the model returns the generator's log-probabilities: NLL is the cross-entropy
        gen_loss = F.nll_loss(out.generator_logits, out.masked_targets)

        # mean over the non-pad tokens as a weighted sum: no boolean indexing, which would
        # wait for the device to know how many tokens there are
        real = ~out.padding_mask
        disc_logits = out.discriminator_logits.float()
        replaced = out.replaced
        per_token = F.binary_cross_entropy_with_logits(disc_logits, replaced.float(),
                                                       reduction="none")
        tokens = real.sum()
        disc_loss = per_token.masked_fill(~real, 0.0).sum() / tokens
        loss = gen_loss + self.disc_weight * disc_loss

        with torch.no_grad():
            predicted = (disc_logits > 0) & real
            counts = {
                "masked": out.masked_targets.numel(),
                "tokens": tokens,
                "replaced": replaced.sum(),  # pad positions are never replaced
                "predicted_replaced": predicted.sum(),
                "true_replaced": (predicted & replaced).sum(),
                "gen_correct": (out.generator_logits.argmax(-1) == out.masked_targets).sum(),
                "disc_correct": (predicted == replaced).logical_and_(real).sum(),
            }
        logging_output = {
            "loss": loss.detach(),
            "gen_loss": gen_loss.detach(),
            "disc_loss": disc_loss.detach(),
            "ntokens": sample["ntokens"],
            "nsentences": sample["nsentences"],
            "sample_size": 1,
            **counts,
        }
        counter = getattr(model, "flops_counter", None) if model.training else None
        if counter is not None:
            ElectraCriterion._counter = weakref.ref(counter)
            tokens_in = sample["net_input"]["src_tokens"]
            disc, gen = model_sizes(model.cfg)
            logging_output["flops"] = paper_train_flops(
                disc, gen, vocab=out.generator_logits.size(-1), length=tokens_in.size(1),
                sequences=tokens_in.size(0), predicted=out.masked_targets.numel())
        return loss, 1, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        batches = total("sample_size")
        for key in ("loss", "gen_loss", "disc_loss"):
            metrics.log_scalar(key, total(key) / max(batches, 1), batches, round=3)
        for key in COUNTS:
            metrics.log_scalar(f"_{key}", total(key))

        def rate(numer, denom):
            return lambda m: round(100 * float(m[f"_{numer}"].sum) / max(float(m[f"_{denom}"].sum), 1), 2)

        metrics.log_derived("gen_acc", rate("gen_correct", "masked"))
        metrics.log_derived("disc_acc", rate("disc_correct", "tokens"))
        metrics.log_derived("disc_precision", rate("true_replaced", "predicted_replaced"))
        metrics.log_derived("disc_recall", rate("true_replaced", "replaced"))
        metrics.log_derived("replaced_frac", rate("replaced", "masked"))
        # accuracy of always answering "original", the baseline disc_acc must beat
        metrics.log_derived("disc_baseline", lambda m: round(100 - rate("replaced", "tokens")(m), 2))

        counter = ElectraCriterion._counter and ElectraCriterion._counter()
        if counter is not None and any("flops" in log for log in logging_outputs):
            # weight 0: the meter shows the latest value, the running total after this update
            metrics.log_scalar("train_flops", counter.add(total("flops")), weight=0,
                               priority=600, round=0)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
