"""Electric (Clark et al., EMNLP 2020): the discriminator as an energy-based cloze model,
trained by noise-contrastive estimation against the two-tower cloze generator's q."""

import torch
import torch.nn.functional as F

from ...metrics.auc import auc_pair_counts
from .base import Objective, picked, register_objective


@register_objective("electric")
class Electric(Objective):
    """The discriminator head's raw output is the energy E(x̂)_t (p(x_t | x_\\t) is taken
    as exp(-E)); each token is told noise (one of the picked positions, label 1 even when
    the sample is the original) from data by the NCE posterior
    ``sigmoid(E + log q(x̂_t) + log(k / (n - k)))``, with ``log q`` the noise
    distribution's, without gradient, and the official log(mask_prob / (1 - mask_prob)) as
    ``log(k / (n - k))``; BCE averaged over the non-pad tokens, weighted by --disc-weight.

    Logged: ``disc_acc`` (the NCE posterior's accuracy over the non-pad tokens),
    ``disc_auc``, and ``noise_precision`` / ``noise_recall`` of the tokens it calls noise
    (the noise tokens are the picked ones: ``masked``).
    """

    needs_cloze = True  # log q at every token: a cloze generator kind (two_tower)
    logged_counts = ("tokens", "disc_correct", "disc_auc_pairs", "predicted_noise",
                     "true_noise")
    logged_rates = (("disc_acc", "disc_correct", "tokens"),
                    ("noise_precision", "true_noise", "predicted_noise"),
                    ("noise_recall", "true_noise", "masked"))

    def predict(self, model, hidden, positions):
        # the energy and the prior log-odds of noise: the NCE logit but for log q, which
        # main_loss adds (the prior is the run's --mask-prob, which the generator kind holds)
        return model.discriminator_head(hidden) + model.generator_kind.noise_log_odds, None

    def main_loss(self, out):
        covered = ~out.padding_mask
        noise = picked(out)
        log_q = out.noise_log_probs.detach().gather(-1, out.corrupted[..., None]).squeeze(-1)
        logits = out.main.float() + log_q
        per_token = F.binary_cross_entropy_with_logits(logits, noise.float(), reduction="none")
        tokens = covered.sum()
        loss = per_token.masked_fill(~covered, 0.0).sum() / tokens.clamp(min=1)
        with torch.no_grad():
            predicted = (logits > 0) & covered
            counts = {
                "tokens": tokens,
                "predicted_noise": predicted.sum(),
                "true_noise": (predicted & noise).sum(),
                "disc_correct": (predicted == noise).logical_and_(covered).sum(),
                "disc_auc_pairs": auc_pair_counts(logits, noise, covered),
            }
        return loss, per_token, counts
