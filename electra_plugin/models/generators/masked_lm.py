"""The official generator: a small masked LM trained with the discriminator by maximum
likelihood (cross-entropy at the masked positions)."""

from contextlib import nullcontext

import torch
import torch.nn.functional as F

from ..core.config import arch_generator_layers, arch_generator_size, scaled_size
from ..objectives import masked_mean
from .base import GeneratorKind, register_generator_kind


@register_generator_kind("masked_lm")
class MaskedLMGenerator(GeneratorKind):
    reads = ("generator_size", "generator_layers", "temperature")
    masked_lm_encoder = True
    embedding_sharing = ("shared", "untied", "gdes")
    logged_means = ("gen_loss",)
    logged_counts = ("gen_correct",)
    logged_rates = (("gen_acc", "gen_correct", "masked"),)

    def size(self):
        fraction = self.cfg.get("generator_size", None) or arch_generator_size(self.cfg)
        layers = self.cfg.get("generator_layers", None)
        if layers is None:
            layers = arch_generator_layers(self.cfg)
        return scaled_size(self.disc_size(), fraction, layers)

    def build(self, model, dictionary, shared_embeddings):
        embeddings = model.make_embeddings() if self.sharing == "untied" else shared_embeddings
        model.generator = model.make_encoder(embeddings, self.size(),
                                             generator=self.masked_lm_encoder)
        self.build_head(model)

    def build_head(self, model):
        model.generator_head = model.body.generator_head(
            self.size().hidden, model.generator.embeddings.word_embeddings)

    def propose(self, model, src_tokens, layout, positions, token_types=None):
        with nullcontext() if self.trains(model) else torch.no_grad():
            hidden, _ = model.generator.encode(src_tokens, layout, token_types)
            hidden = hidden.flatten(0, 1)[positions]
            log_probs = F.log_softmax(model.generator_head(hidden), dim=-1, dtype=torch.float32)
        return log_probs, self.baseline(model, hidden)

    def baseline(self, model, hidden):
        """M x G generator states -> M baseline logits; maximum likelihood needs none."""
        return None

    def trains(self, model):
        return True

    def loss(self, model, out, per_token):
        with torch.no_grad():  # the official masked_lm_accuracy
            correct = (out.generator_log_probs.argmax(-1) == out.masked_targets) & \
                out.masked_weights.bool()
        logs = {"gen_correct": correct.sum()}
        if not self.trains(model):
            return None, logs
        loss = self.trained_loss(out, per_token)
        logs["gen_loss"] = loss.detach()
        return loss, logs

    def trained_loss(self, out, per_token):
        """Cross-entropy at the masked positions."""
        return masked_mean(-out.generator_log_probs.gather(1, out.masked_targets[:, None])
                           .squeeze(1), out.masked_weights)
