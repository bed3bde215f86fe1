"""BERT's post-LayerNorm encoder with learned absolute positions and token types (ELECTRA's,
HF ``ElectraModel``'s names): :mod:`..core.encoder`."""

from ..core.encoder import ElectraEmbeddings, ElectraTransformer
from .base import EncoderBody, register_body


@register_body("bert")
class BertBody(EncoderBody):
    def embeddings(self, word_embeddings=None) -> ElectraEmbeddings:
        cfg = self.cfg
        return ElectraEmbeddings(self.vocab_size, cfg.embedding_size, cfg.max_positions,
                                 cfg.type_vocab_size, self.padding_idx, cfg.dropout,
                                 word_embeddings)

    def encoder(self, embeddings, size, generator=False) -> ElectraTransformer:
        return ElectraTransformer(embeddings, size, self.cfg.dropout,
                                  self.cfg.attention_dropout, self.padding_idx)
