"""What an objective is: the interface :meth:`ElectraModel.electra_step` calls.

Every objective runs on the same batch (masked input + original tokens at the picked
positions) and the same generator; it decides:

- ``corrupts``: whether the generator's samples replace the picked positions (all but
  ``mlm``, which keeps ``<mask>`` as BERT does);
- ``heads``: which pre-training heads the discriminator gets (``discriminator_head``: one
  logit per token; ``mlm_head``: vocabulary logits tied to the token embeddings), and what
  they cost in FLOPs;
- ``predict`` / ``main_loss``: what those heads compute and the loss on them;
- ``binary``: whether that loss is a replaced/original one, which the ``electra`` criterion
  weights by ``--disc-weight``.
"""

from typing import Dict, NamedTuple, Optional

import torch

from ...user_io.errors import ElectraUsageError
from ..core.flops import paper_discriminator_output
from ..core.heads import ElectraDiscriminatorPredictions, ElectraGeneratorPredictions

OBJECTIVES: Dict[str, "Objective"] = {}


def register_objective(name):
    """Class decorator: ``--objective name`` uses (one instance of) this class."""
    def register(cls):
        cls.name = name
        OBJECTIVES[name] = cls()
        return cls

    return register


def objective_named(name: str) -> "Objective":
    if name not in OBJECTIVES:
        raise ElectraUsageError(f"--objective {name} is not an objective; pick one of "
                                f"{', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


def picked(out) -> torch.Tensor:
    """B x T bool: the picked positions (the prediction slots of weight 1)."""
    covered = torch.zeros_like(out.padding_mask)
    return covered.flatten().index_put_((out.positions,), out.masked_weights.bool()) \
        .view_as(covered)


def masked_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Mean of M values over the picked positions (``weights`` 1, padding slots 0); 0 (not
    NaN) for a batch without any, as a batch of ``<s> </s>`` lines gives."""
    return (values * weights).sum() / weights.sum().clamp(min=1)


class PretrainingOutput(NamedTuple):
    """What one pre-training step produced (a tuple, so DDP can walk it).

    ``generator_log_probs`` is the distribution the replacements were drawn from (a network
    generator's, or the unigram table's), None for ``--objective mlm``; ``main``/``copy``
    are None while two-stage training trains the generator alone.
    """

    generator_log_probs: Optional[torch.Tensor]  # M x V fp32 at the M prediction slots
    baseline_logits: Optional[torch.Tensor]  # M, adversarial generator's learned baseline
    masked_targets: torch.Tensor  # M, the original tokens at the slots (<pad> at padding)
    positions: torch.Tensor  # M, flat indices (into B x T) of the prediction slots
    masked_weights: torch.Tensor  # M float: 1 at a picked position, 0 at a padding slot
    corrupted: torch.Tensor  # B x T, the discriminator's input
    original: torch.Tensor  # B x T, the uncorrupted tokens
    replaced: torch.Tensor  # B x T bool: the input differs from the original there
    padding_mask: torch.Tensor  # B x T bool
    main: Optional[torch.Tensor]  # the objective's prediction (see its predict)
    copy: Optional[torch.Tensor]  # B x T copy logits (all_tokens_mlm)
    disc_hidden: Optional[torch.Tensor] = None  # B x T x H discriminator's last layer
    # B x T x V fp32 log q(. | the other tokens) at every token: a cloze generator's
    # (two_tower, Electric's noise distribution); None for every other kind
    noise_log_probs: Optional[torch.Tensor] = None
    main_loss: Optional[torch.Tensor] = None  # the objective's (None: no discriminator ran)
    generator_loss: Optional[torch.Tensor] = None  # None: the generator learns nothing
    logs: Optional[dict] = None  # the losses and counts the batch logs
    # the criterion's loss of the two, where a graphed step took its gradients in its graph
    # (the criterion's own rule, called there: speed/compile.py); None: the criterion makes it
    loss: Optional[torch.Tensor] = None

    # What a training step's reader (the criterion) takes of the output, and what a graphed
    # step fills in itself: speed/compile.py returns the first from its graph and checks both
    # against the fields before it compiles, so that a renamed field fails there, loudly
    TRAINING_FIELDS = ("main_loss", "generator_loss", "logs")
    FILLED_BY_THE_GRAPH = ("positions", "masked_weights", "loss")


class Objective:
    name: str
    corrupts = True
    heads = ("discriminator_head",)
    binary = True  # the main loss is a replaced/original loss, weighted by --disc-weight
    loss_name = "disc_loss"  # the main loss's name in the log
    needs_cloze = False  # reads the noise log-probabilities at every token (a cloze kind)
    # what main_loss counts (summed over batches) and the rates (name, numerator count,
    # denominator count) derived from them; "masked" is the step's own count
    logged_counts = ()
    logged_rates = ()

    def check(self, cfg) -> None:
        """Raise one line for model options this objective cannot honour."""

    def build_heads(self, model, word_embeddings) -> None:
        """Add the pre-training heads to ``model`` (the MLM head tied to the discriminator's
        ``word_embeddings``)."""
        if "discriminator_head" in self.heads:
            model.discriminator_head = ElectraDiscriminatorPredictions(model.cfg.hidden_size)
        if "mlm_head" in self.heads:
            model.mlm_head = ElectraGeneratorPredictions(
                model.cfg.hidden_size, model.cfg.embedding_size, word_embeddings)

    def paper_head_flops(self, disc, vocab: int, positions: int, predicted: float) -> float:
        """Forward FLOPs of the heads, as the paper counts them."""
        return positions * paper_discriminator_output(disc)

    def predict(self, model, hidden, positions):
        """Discriminator features B x T x H -> (main, copy) of :class:`PretrainingOutput`."""
        raise NotImplementedError

    def main_loss(self, out: PretrainingOutput):
        """-> (loss, per-token loss B x T or None, counts for the log)."""
        raise NotImplementedError


