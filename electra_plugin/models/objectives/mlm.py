"""BERT's masked LM, on <mask> or on generator samples (the paper's Replace MLM)."""

import torch
import torch.nn.functional as F

from ..core.flops import paper_generator_output
from .base import Objective, masked_mean, register_objective


@register_objective("mlm")
class MaskedLM(Objective):
    """BERT: the discriminator network predicts the original token at the picked positions."""

    corrupts = False
    heads = ("mlm_head",)
    binary = False
    loss_name = "mlm_loss"
    logged_counts = ("mlm_correct", "mlm_tokens")
    logged_rates = (("mlm_acc", "mlm_correct", "mlm_tokens"),)

    def paper_head_flops(self, disc, vocab, positions, predicted):
        return predicted * paper_generator_output(disc, vocab)

    def predict(self, model, hidden, positions):
        logits = model.mlm_head(hidden.flatten(0, 1)[positions])
        return F.log_softmax(logits, dim=-1, dtype=torch.float32), None

    def main_loss(self, out):
        real = out.masked_weights
        loss = masked_mean(-out.main.gather(1, out.masked_targets[:, None]).squeeze(1), real)
        with torch.no_grad():
            correct = ((out.main.argmax(-1) == out.masked_targets) & real.bool()).sum()
        return loss, None, {"mlm_correct": correct, "mlm_tokens": real.sum()}


@register_objective("replace_mlm")
class ReplaceMLM(MaskedLM):
    """Replace MLM: masked LM whose picked positions hold generator samples, not <mask>."""

    corrupts = True
