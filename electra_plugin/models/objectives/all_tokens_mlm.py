"""The paper's All-Tokens MLM: Replace MLM predicting every token, with a copy mechanism."""

import torch
import torch.nn.functional as F

from ..core.flops import paper_discriminator_output, paper_generator_output
from .base import Objective, register_objective


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
    logged_counts = ("mlm_correct", "mlm_tokens")
    logged_rates = (("mlm_acc", "mlm_correct", "mlm_tokens"),)

    def paper_head_flops(self, disc, vocab, positions, predicted):
        return positions * (paper_generator_output(disc, vocab)
                            + paper_discriminator_output(disc))

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
