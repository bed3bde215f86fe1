"""The paper's unigram generator: samples from dict.txt's token counts; nothing to learn."""

import torch

from ..core.fixed_dtype import FixedDtypeBuffers
from .base import GeneratorKind, register_generator_kind


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


@register_generator_kind("unigram")
class UnigramGenerator(GeneratorKind):
    def build(self, model, dictionary, shared_embeddings):
        model.unigram = UnigramTable(dictionary, dictionary.index("<mask>"))

    def propose(self, model, src_tokens, layout, positions, token_types=None):
        return model.unigram.log_probs.expand(len(positions), -1), None
