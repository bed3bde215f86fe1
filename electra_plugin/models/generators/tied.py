"""The paper's weight-sharing ablation (section 3.2): the generator is the discriminator."""

from .base import register_generator_kind
from .masked_lm import MaskedLMGenerator


@register_generator_kind("tied")
class TiedGenerator(MaskedLMGenerator):
    """Every weight shared: the discriminator's encoder also predicts the masked tokens,
    through a generator head of its own."""

    reads = ("temperature",)
    embedding_sharing = ("shared",)

    def size(self):
        return self.disc_size()

    def build(self, model, dictionary, shared_embeddings):
        model.generator = model.discriminator
        self.build_head(model)
