"""The official ``uniform_generator``: replacements drawn uniformly, no network, nothing to
learn; the baseline that tells what a generator's choice of replacements is worth."""

import math

import torch

from .base import GeneratorKind, register_generator_kind


@register_generator_kind("uniform")
class UniformGenerator(GeneratorKind):
    """Uniform over unigram's candidates, no specials nor <mask> (official: over every id)."""

    def build(self, model, dictionary, shared_embeddings):
        self.specials, self.mask_idx = dictionary.nspecial, dictionary.index("<mask>")
        self.candidates = len(dictionary) - len({*range(self.specials), self.mask_idx})

    def propose(self, model, src_tokens, layout, positions, token_types=None):
        # made on the batch's device at each step: V numbers, no module, no host copy
        row = torch.full((model.vocab_size,), -math.log(self.candidates),
                         device=src_tokens.device)
        row[:self.specials] = float("-inf")
        row[self.mask_idx] = float("-inf")
        return row.expand(len(positions), -1), None
