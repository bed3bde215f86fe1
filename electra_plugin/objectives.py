"""The pre-training objectives of the paper's ablations (section 3.2, Table 5), one class each.

Every objective runs on the same batch (masked input + original tokens at the picked
positions) and the same generator; it decides three things:

- ``corrupts``: whether the generator's samples replace the picked positions (all but
  ``mlm``, which keeps ``<mask>`` as BERT does);
- ``heads``: which pre-training heads the discriminator gets (``discriminator_head``: one
  logit per token; ``mlm_head``: vocabulary logits tied to the token embeddings);
- ``predict`` / ``main_loss``: what those heads compute and the loss on them.

:meth:`~electra_plugin.models.electra.ElectraModel.electra_step` calls them at its step 5
(discriminator) and 6 (loss); the generator's own loss comes from :mod:`.generators`. The
step adds the two, weighting binary (replaced/original) losses by ``--disc-weight``.
"""

from typing import Dict, NamedTuple, Optional

import torch
import torch.nn.functional as F

from .auc import auc_pair_counts

OBJECTIVES: Dict[str, "Objective"] = {}


def register_objective(name):
    def register(cls):
        cls.name = name
        OBJECTIVES[name] = cls()
        return cls

    return register


def masked_mean(values: torch.Tensor) -> torch.Tensor:
    """Mean over the M picked positions; 0 (not NaN) for a batch without any, as a batch of
    ``<s> </s>`` lines gives (M is known on the host: the picked positions set shapes)."""
    return values.sum() / max(values.numel(), 1)


class PretrainingOutput(NamedTuple):
    """What one pre-training step produced (a tuple, so DDP can walk it).

    ``generator_log_probs`` is the distribution the replacements were drawn from (a network
    generator's, or the unigram table's), None for ``--objective mlm``; ``main``/``copy``
    are None while two-stage training trains the generator alone.
    """

    generator_log_probs: Optional[torch.Tensor]  # M x V fp32 at the M picked positions
    baseline_logits: Optional[torch.Tensor]  # M, adversarial generator's learned baseline
    masked_targets: torch.Tensor  # M, the original tokens at the picked positions
    positions: torch.Tensor  # M, flat indices (into B x T) of the picked positions
    corrupted: torch.Tensor  # B x T, the discriminator's input
    original: torch.Tensor  # B x T, the uncorrupted tokens
    replaced: torch.Tensor  # B x T bool: the input differs from the original there
    padding_mask: torch.Tensor  # B x T bool
    main: Optional[torch.Tensor]  # the objective's prediction (see its predict)
    copy: Optional[torch.Tensor]  # B x T copy logits (all_tokens_mlm)
    disc_hidden: Optional[torch.Tensor] = None  # B x T x H discriminator's last layer
    loss: Optional[torch.Tensor] = None  # L_gen + lambda * L_disc of the batch
    logs: Optional[dict] = None  # the losses and counts the batch logs


class Objective:
    name: str
    corrupts = True
    heads = ("discriminator_head",)
    binary = True  # the main loss is a replaced/original loss, weighted by --disc-weight
    loss_name = "disc_loss"

    def predict(self, model, hidden, positions):
        """Discriminator features B x T x H -> (main, copy) of :class:`PretrainingOutput`."""
        raise NotImplementedError

    def main_loss(self, out: PretrainingOutput):
        """-> (loss, per-token loss B x T or None, counts for the log)."""
        raise NotImplementedError


@register_objective("electra")
class ReplacedTokenDetection(Objective):
    """ELECTRA: the discriminator labels every token original or replaced."""

    def predict(self, model, hidden, positions):
        return model.discriminator_head(hidden), None

    def covered(self, out):
        """B x T bool: the tokens the loss is averaged over."""
        return ~out.padding_mask

    def main_loss(self, out):
        covered = self.covered(out)
        logits = out.main.float()
        per_token = F.binary_cross_entropy_with_logits(logits, out.replaced.float(),
                                                       reduction="none")
        tokens = covered.sum()
        # a weighted mean, not boolean indexing, which would wait for the device
        loss = per_token.masked_fill(~covered, 0.0).sum() / tokens.clamp(min=1)
        with torch.no_grad():
            predicted = (logits > 0) & covered
            replaced = out.replaced & covered
            counts = {
                "tokens": tokens,
                "replaced": replaced.sum(),
                "predicted_replaced": predicted.sum(),
                "true_replaced": (predicted & replaced).sum(),
                "disc_correct": (predicted == replaced).logical_and_(covered).sum(),
                "disc_auc_pairs": auc_pair_counts(logits, out.replaced, covered),
            }
        return loss, per_token, counts


@register_objective("electra_15")
class MaskedTokenDetection(ReplacedTokenDetection):
    """ELECTRA 15%: the discriminator's loss only at the picked positions."""

    def covered(self, out):
        covered = torch.zeros_like(out.padding_mask)
        return covered.flatten().index_fill_(0, out.positions, True).view_as(covered)


@register_objective("mlm")
class MaskedLM(Objective):
    """BERT: the discriminator network predicts the original token at the picked positions."""

    corrupts = False
    heads = ("mlm_head",)
    binary = False
    loss_name = "mlm_loss"

    def predict(self, model, hidden, positions):
        logits = model.mlm_head(hidden.flatten(0, 1)[positions])
        return F.log_softmax(logits, dim=-1, dtype=torch.float32), None

    def main_loss(self, out):
        loss = masked_mean(-out.main.gather(1, out.masked_targets[:, None]))
        with torch.no_grad():
            correct = (out.main.argmax(-1) == out.masked_targets).sum()
        return loss, None, {"mlm_correct": correct, "mlm_tokens": out.masked_targets.numel()}


@register_objective("replace_mlm")
class ReplaceMLM(MaskedLM):
    """Replace MLM: masked LM whose picked positions hold generator samples, not <mask>."""

    corrupts = True


@register_objective("all_tokens_mlm")
class AllTokensMLM(Objective):
    """All-Tokens MLM: Replace MLM predicting every token, with a copy mechanism.

    ``p(x_t) = D_t * 1[x_t = input_t] + (1 - D_t) * softmax(mlm_head(h_t))[x_t]``, with the
    copy probability ``D_t = sigmoid(discriminator_head(h_t))``; the loss is the negative
    log-likelihood of the original token averaged over all non-pad tokens.
    """

    heads = ("mlm_head", "discriminator_head")
    binary = False
    loss_name = "mlm_loss"

    def predict(self, model, hidden, positions):
        return model.mlm_head(hidden), model.discriminator_head(hidden)

    def main_loss(self, out):
        real = ~out.padding_mask
        original = out.original
        vocab_log_probs = F.log_softmax(out.main.float(), dim=-1)
        predicted = vocab_log_probs.gather(-1, original[..., None]).squeeze(-1)
        copy = out.copy.float()
        log_copy, log_no_copy = F.logsigmoid(copy), F.logsigmoid(-copy)
        no_copy = log_no_copy + predicted
        log_likelihood = torch.where(out.replaced, no_copy, torch.logaddexp(log_copy, no_copy))
        tokens = real.sum()
        loss = -log_likelihood.masked_fill(~real, 0.0).sum() / tokens.clamp(min=1)
        with torch.no_grad():
            # the prediction: the input token when copying wins, else the softmax's argmax
            best = vocab_log_probs.argmax(-1)
            keep = log_copy > log_no_copy + vocab_log_probs.max(-1).values
            guess = torch.where(keep, out.corrupted, best)
            counts = {"mlm_correct": (guess == original).logical_and_(real).sum(),
                      "mlm_tokens": tokens}
        return loss, None, counts
