"""Where the replacements come from and how the generator learns: the paper's generator variants.

:meth:`~electra_plugin.models.electra.ElectraModel.electra_step` asks its generator for
M x V log-probabilities at the masked positions (``propose``), samples them, and once the
discriminator has run asks for the generator's loss (``loss``). ``--generator`` and
``--generator-training`` pick the class; ``--objective mlm`` has none (BERT keeps ``<mask>``).
"""

from contextlib import nullcontext

import torch
import torch.nn.functional as F

from .fixed_dtype import FixedDtypeBuffers
from .objectives import OBJECTIVES, PretrainingOutput, masked_mean


class MaskedLMGenerator:
    """The official generator: a small masked LM trained by maximum likelihood.

    In two-stage training's second stage it is frozen: it only samples (no gradient, no loss).
    """

    def propose(self, model, src_tokens, attn_mask, positions):
        """-> (M x V fp32 log-probabilities, M baseline logits or None)."""
        with torch.no_grad() if model.generator_frozen else nullcontext():
            hidden, _ = model.generator.encode(src_tokens, attn_mask)
            hidden = hidden.flatten(0, 1)[positions]
            log_probs = F.log_softmax(model.generator_head(hidden), dim=-1, dtype=torch.float32)
        return log_probs, self.baseline(model, hidden)

    def baseline(self, model, hidden):
        """M x G generator states -> M baseline logits; maximum likelihood needs none."""
        return None

    def loss(self, model, out: PretrainingOutput, per_token):
        """-> (the generator's loss, its counts for the log); ``per_token``: the B x T
        discriminator loss of a binary objective (None otherwise)."""
        with torch.no_grad():  # the official masked_lm_accuracy
            correct = out.generator_log_probs.argmax(-1) == out.masked_targets
        logs = {"gen_correct": correct.sum()}
        if model.generator_frozen:
            return out.replaced.new_zeros((), dtype=torch.float32), logs
        loss = self.trained_loss(out, per_token)
        logs["gen_loss"] = loss.detach()
        return loss, logs

    def trained_loss(self, out: PretrainingOutput, per_token):
        """Cross-entropy at the masked positions."""
        return masked_mean(-out.generator_log_probs.gather(1, out.masked_targets[:, None]))


class AdversarialGenerator(MaskedLMGenerator):
    """The paper's Appendix F: REINFORCE on the discriminator's loss with a learned baseline.

    The generator maximises ``r_t``, the discriminator's BCE on its sample at t, against a
    baseline ``b_t = -log sigmoid(w . h_G(t))`` fitted to ``r_t`` by cross-entropy against
    ``exp(-r_t)`` (the discriminator's probability of the right label).
    """

    def baseline(self, model, hidden):
        # trained on its own loss only: no gradient reaches the generator through it
        return model.generator_baseline(hidden.detach()).squeeze(-1)

    def trained_loss(self, out, per_token):
        reward = per_token.detach().flatten()[out.positions]
        sampled = out.corrupted.flatten()[out.positions]
        sample_log_prob = out.generator_log_probs.gather(1, sampled[:, None]).squeeze(1)
        baseline = -F.logsigmoid(out.baseline_logits.float())
        policy = masked_mean(-(reward - baseline.detach()) * sample_log_prob)
        fit = masked_mean(F.binary_cross_entropy_with_logits(
            out.baseline_logits.float(), torch.exp(-reward), reduction="none"))
        return policy + fit


class UnigramTable(FixedDtypeBuffers):
    """fp32 log-probabilities of dict.txt's counts over the ordinary tokens (the model's
    ``unigram``; not saved: dict.txt rebuilds it)."""

    def __init__(self, dictionary, mask_idx):
        super().__init__()
        counts = torch.tensor(dictionary.count, dtype=torch.float64)
        ordinary = torch.ones(len(counts), dtype=torch.bool)
        ordinary[:dictionary.nspecial] = False  # <s> <pad> </s> <unk>
        ordinary[mask_idx] = False
        if counts[ordinary].sum() == 0:  # a dict.txt without counts: uniform
            counts.fill_(1)
        counts.masked_fill_(~ordinary, 0)
        self.register_buffer("log_probs", counts.div(counts.sum()).log().float(),
                             persistent=False)


class UnigramGenerator:
    """The paper's unigram generator: dict.txt's token counts; no network, nothing to learn."""

    def propose(self, model, src_tokens, attn_mask, positions):
        return model.unigram.log_probs.expand(len(positions), -1), None

    def loss(self, model, out, per_token):
        return out.replaced.new_zeros((), dtype=torch.float32), {}


def build_generator(cfg):
    """The generator variant of a config; None for ``--objective mlm``."""
    if not OBJECTIVES[cfg.get("objective", "electra")].corrupts:
        return None
    if cfg.generator == "unigram":
        return UnigramGenerator()
    return AdversarialGenerator() if cfg.generator_training == "adversarial" else \
        MaskedLMGenerator()
