"""ELECTRA's replaced token detection, on every token or only at the picked positions."""

import torch
import torch.nn.functional as F

from ...metrics.auc import auc_pair_counts
from .base import Objective, picked, register_objective


@register_objective("electra")
class ReplacedTokenDetection(Objective):
    """ELECTRA: the discriminator labels every token original or replaced."""

    logged_counts = ("tokens", "replaced", "predicted_replaced", "true_replaced",
                     "disc_correct", "disc_auc_pairs")
    logged_rates = (("disc_acc", "disc_correct", "tokens"),
                    ("disc_precision", "true_replaced", "predicted_replaced"),
                    ("disc_recall", "true_replaced", "replaced"),
                    ("replaced_frac", "replaced", "masked"))

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
        return picked(out)
