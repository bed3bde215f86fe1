"""The pre-training criterion: runs the model's step, logs its losses, counts and FLOPs."""

from dataclasses import dataclass, field

import torch
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass

from ..metrics.auc import auc_from_counts
from ..models.generators import GENERATOR_KINDS
from ..models.objectives import OBJECTIVES

# What the step itself logs besides its objective's and generator kind's (each declares its
# own: ``logged_counts``, ``logged_rates``, ``logged_means``): counts and sums summed over
# micro-batches and workers, and rates (name, numerator, denominator) derived from them.
STEP_COUNTS = ("masked", "sampled_correct", "feature_sum", "feature_sq_sum", "feature_seqs")
STEP_RATES = (("sampled_acc", "sampled_correct", "masked"),)


def logged_keys():
    """(means, counts, rates) that any registered objective or generator kind logs."""
    variants = list(OBJECTIVES.values()) + list(GENERATOR_KINDS.values())
    means = ("loss",) + tuple(dict.fromkeys(
        [o.loss_name for o in OBJECTIVES.values()] +
        [m for v in GENERATOR_KINDS.values() for m in v.logged_means]))
    counts = tuple(dict.fromkeys(STEP_COUNTS + tuple(c for v in variants
                                                     for c in v.logged_counts)))
    rates = tuple(dict.fromkeys(STEP_RATES + tuple(r for v in variants
                                                   for r in v.logged_rates)))
    return means, counts, rates


def pooled_feature_sums(hidden, padding_mask):
    """Per-dim sums over sequences of the mean-pooled features and of their squares (fp64),
    and the number of sequences: what :func:`feature_spread` needs, summable over batches."""
    with torch.no_grad():
        real = ~padding_mask
        pooled = hidden.float().masked_fill(~real[..., None], 0.0).sum(1).double() / \
            real.sum(1, keepdim=True)
        return {"feature_sum": pooled.sum(0), "feature_sq_sum": pooled.square().sum(0),
                "feature_seqs": len(pooled)}


def feature_spread(total, squares, sequences) -> float:
    """How much sequences' pooled features differ, relative to their common part: the root
    of the mean over dims of their (unbiased) variance across sequences, over the norm of
    their mean (examples/recipe/probe.py measures checkpoints with it too).

    It falls towards 0 as the discriminator's features stop depending on the input
    (collapse). NaN below two sequences (or from a meter fairseq reset: a plain 0).
    """
    if not torch.is_tensor(total) or sequences < 2:
        return float("nan")
    mean = total / sequences
    variance = ((squares - total * mean) / (sequences - 1)).clamp(min=0)
    return float(variance.mean().sqrt() / mean.norm())


@dataclass
class ElectraCriterionConfig(FairseqDataclass):
    disc_weight: float = field(
        default=50.0, metadata={"help": "lambda, the weight of the discriminator loss "
                                        "(official: 50)"})
    gen_weight: float = field(
        default=1.0, metadata={"help": "the weight of the generator's loss (official "
                                       "gen_weight: 1)"})


@register_criterion("electra", dataclass=ElectraCriterionConfig)
class ElectraCriterion(FairseqCriterion):
    """``L = g * L_gen + w * L_main`` for one batch, for any ``--objective`` of the model, from the
    two losses :meth:`~electra_plugin.models.electra.ElectraModel.electra_step` returns.

    ``L_gen`` is the generator's loss (cross-entropy averaged over the masked positions, or
    REINFORCE; none when the generator learns nothing), ``L_main`` the objective's loss
    (:mod:`electra_plugin.models.objectives`), with ``g = --gen-weight`` (1) and
    ``w = --disc-weight`` for the binary objectives (``electra``: BCE averaged over all non-pad
    tokens; ``electra_15``: over the masked ones) and 1 for the MLM ones. Both are per-batch
    means, as in the official code, so ``sample_size`` is 1 per batch: with ``--update-freq
    k`` or k workers the update averages the k batch losses.

    Training batches also log their FLOPs as the paper counts them (:mod:`..flops`, with
    the batch's own length and number of masked positions); the ``electra`` task adds each
    update's sum to the model's :class:`~electra_plugin.models.core.flops.FlopsCounter` and logs the
    running total as ``train_flops``, so that runs can be compared at equal compute (the
    ``wall`` column gives the time it took).

    Validation batches (model in eval mode) also log the sums :func:`feature_spread` turns
    into ``disc_feature_spread``, which tells a collapsed discriminator from a healthy one.
    """

    def __init__(self, task, disc_weight, gen_weight=1.0):
        super().__init__(task)
        self.disc_weight, self.gen_weight = disc_weight, gen_weight

    def loss_weights(self, model):
        """(w, g): the weights of ``L_main`` and ``L_gen`` in the loss."""
        return (self.disc_weight if model.objective.binary else 1.0), self.gen_weight

    def combine(self, model, out):
        """The loss of one step, ``w L_main + g L_gen``: the one rule, which a graphed step
        calls inside its graph to take the loss's gradients there (speed/compile.py)."""
        main_weight, gen_weight = self.loss_weights(model)
        loss = 0.0
        if out.main_loss is not None:
            loss = main_weight * out.main_loss
        if out.generator_loss is not None:
            loss = loss + gen_weight * out.generator_loss  # x 1.0 is exact: no change
        return loss

    def forward(self, model, sample, reduce=True):
        """The step is :meth:`ElectraModel.electra_step`, run through ``model`` (the DDP
        wrapper in distributed training); this combines its losses and logs around it."""
        out = model(**sample["net_input"], target=sample["target"])
        loss = self.combine(model, out) if out.loss is None else out.loss
        logging_output = self.logging_output(model, sample, out.logs, loss, out.masked_weights)
        if not model.training and out.disc_hidden is not None:
            logging_output.update(pooled_feature_sums(out.disc_hidden, out.padding_mask))
        return loss, 1, logging_output

    @staticmethod
    def logging_output(model, sample, logs, loss, masked_weights) -> dict:
        """What one batch logs (the whole update, speed/whole_update.py, logs its batches
        so too): its counts, the step's ``logs``, the loss and, in training, its FLOPs."""
        logging_output = {"ntokens": sample["ntokens"], "nsentences": sample["nsentences"],
                          "sample_size": 1, **logs, "loss": loss.detach()}
        if model.training and getattr(model, "flops_counter", None) is not None:
            tokens = sample["net_input"]["src_tokens"]
            predicted = sample.get("nmasked")  # the collater's host count (else a sync)
            if predicted is None:
                predicted = int(masked_weights.sum())
            logging_output["flops"] = model.train_flops(tokens.size(1), tokens.size(0),
                                                        predicted)
        return logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        batches = total("sample_size")
        means, counts, rates = logged_keys()
        for key in means:
            if any(key in log for log in logging_outputs):
                metrics.log_scalar(key, total(key) / max(batches, 1), batches, round=3)
        logged = {key for key in counts if any(key in log for log in logging_outputs)}
        for key in logged:
            metrics.log_scalar(f"_{key}", total(key))

        def rate(numer, denom):
            return lambda m: round(
                100 * float(m[f"_{numer}"].sum) / max(float(m[f"_{denom}"].sum), 1), 2)

        for name, numer, denom in rates:
            if numer in logged and denom in logged:
                metrics.log_derived(name, rate(numer, denom))
        if "disc_auc_pairs" in logged:  # the official disc_auc; see metrics/auc.py
            metrics.log_derived("disc_auc", lambda m: round(
                auc_from_counts(m["_disc_auc_pairs"].sum), 4))
        if "feature_seqs" in logged:
            metrics.log_derived("disc_feature_spread", lambda m: round(feature_spread(
                m["_feature_sum"].sum, m["_feature_sq_sum"].sum, m["_feature_seqs"].sum), 4))
        if "replaced" in logged and "tokens" in logged:
            # accuracy of always answering "original", the baseline disc_acc must beat
            metrics.log_derived("disc_baseline",
                                lambda m: round(100 - rate("replaced", "tokens")(m), 2))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
