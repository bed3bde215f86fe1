"""The encoder contract: what the generator, the discriminator and everything around them (the
step, the heads, layer-wise lr decay, the conversion) may ask of a body's encoder.

:class:`BatchLayout` is one batch's shape as the encoders read it, built once per batch: the
pre-training step builds it and hands the same object to the generator and the
discriminator (their inputs differ only at the masked positions, never in padding), so what a
body derives from the padding (the modern body's unpadded rows, DeBERTa's relative
positions) is derived once, in the body's own entry of :meth:`BatchLayout.cached`.
"""

from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn


class BatchLayout:
    """``padding_mask``: B x T, True at padding. ``has_padding`` (a Python bool) spares the
    host-device sync of asking the mask (the electra task's collater knows it).
    ``attn_mask``: a "may attend" mask other than the padding's (Electric's one-directional
    towers); only a body that reads any mask takes such a layout."""

    def __init__(self, padding_mask: torch.Tensor, has_padding: Optional[bool] = None,
                 attn_mask: Optional[torch.Tensor] = None):
        self.padding_mask = padding_mask
        self.has_padding = bool(padding_mask.any()) if has_padding is None else has_padding
        self.custom_mask = attn_mask is not None
        # bool "may attend" mask broadcastable to B x heads x T x T, or None when every token
        # may attend every other (SDPA then picks its fastest kernel)
        self.attn_mask = attn_mask if self.custom_mask else \
            (~padding_mask)[:, None, None, :] if self.has_padding else None
        self._cache: Dict[Hashable, object] = {}

    def cached(self, key: Hashable, build: Callable[[], object]):
        """``build()``'s result, computed on the first call with ``key`` for this batch."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def with_attn_mask(self, attn_mask: torch.Tensor) -> "BatchLayout":
        """The same batch under another "may attend" mask, with a cache of its own."""
        return BatchLayout(self.padding_mask, self.has_padding, attn_mask)


class Encoder(nn.Module):
    """What every body's encoder is: an embedding block (``embeddings``, with a
    ``word_embeddings`` table) and a stack of Transformer layers, run over one batch's
    :class:`BatchLayout`. ``forward`` is the stand-alone call (fine-tuning, the hub, scoring):
    it builds the layout of one batch itself."""

    padding_idx: int
    embeddings: nn.Module
    reads_any_mask = True  # False: the body reads the padding only (no custom attn_mask)

    def layers(self) -> Sequence[nn.Module]:
        """The Transformer layers, bottom first: layer-wise lr decay's depths and the
        conversion's layer count come from here, not from parameter names."""
        return self.encoder.layer

    def below_layers(self) -> Sequence[nn.Module]:
        """What every layer reads, trained at the embeddings' depth by layer-wise lr decay:
        the embedding block and its projection (a body adds what its layers share)."""
        return [m for m in (self.embeddings, getattr(self, "embeddings_project", None))
                if m is not None]

    def encode(self, tokens: torch.Tensor, layout: BatchLayout,
               token_types: Optional[torch.Tensor] = None,
               return_all_hiddens: bool = False) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """tokens: B x T -> (B x T x H last hidden state, the states: the embeddings' then
        every layer's B x T x H when ``return_all_hiddens``, else empty)."""
        raise NotImplementedError

    def forward(self, tokens, token_types=None, padding_mask=None, return_all_hiddens=False,
                has_padding: Optional[bool] = None):
        if padding_mask is None:
            padding_mask = tokens.eq(self.padding_idx)
        return self.encode(tokens, BatchLayout(padding_mask, has_padding), token_types,
                           return_all_hiddens)
