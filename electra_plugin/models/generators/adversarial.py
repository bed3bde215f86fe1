"""The paper's Appendix F: the generator trained by REINFORCE on the discriminator's loss."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..objectives import masked_mean
from .base import register_generator_kind
from .masked_lm import MaskedLMGenerator


@register_generator_kind("adversarial")
class AdversarialGenerator(MaskedLMGenerator):
    """The generator maximises ``r_t``, the discriminator's BCE on its sample at t, against a
    baseline ``b_t = -log sigmoid(w . h_G(t))`` fitted to ``r_t`` by cross-entropy against
    ``exp(-r_t)`` (the discriminator's probability of the right label)."""

    binary_only = True

    def build(self, model, dictionary, shared_embeddings):
        super().build(model, dictionary, shared_embeddings)
        model.generator_baseline = nn.Linear(self.size().hidden, 1)

    def baseline(self, model, hidden):
        # trained on its own loss only: no gradient reaches the generator through it
        return model.generator_baseline(hidden.detach()).squeeze(-1)

    def trained_loss(self, out, per_token):
        reward = per_token.detach().flatten()[out.positions]
        sampled = out.corrupted.flatten()[out.positions]
        sample_log_prob = out.generator_log_probs.gather(1, sampled[:, None]).squeeze(1)
        baseline = -F.logsigmoid(out.baseline_logits.float())
        policy = masked_mean(-(reward - baseline.detach()) * sample_log_prob, out.masked_weights)
        fit = masked_mean(F.binary_cross_entropy_with_logits(
            out.baseline_logits.float(), torch.exp(-reward), reduction="none"),
            out.masked_weights)
        return policy + fit
