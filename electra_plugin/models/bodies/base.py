"""What an encoder body is: the embedding block and the Transformer that the generator and
the discriminator are built from (``--encoder-body``; both networks get the same kind)."""

from typing import Dict, Optional, Tuple, Type

import torch.nn as nn

from ...user_io.errors import ElectraUsageError
from ..core.config import BODY_COMPLETIONS, EncoderSize, option_default, register_arch
from ..core.contract import Encoder
from ..core.flops import paper_encoder_flops
from ..core.heads import ElectraGeneratorPredictions

BODIES: Dict[str, Type["EncoderBody"]] = {}


def register_body(name):
    """Class decorator: ``--encoder-body name`` builds this body."""
    def register(cls):
        cls.name = name
        BODIES[name] = cls
        BODY_COMPLETIONS[name] = cls.complete_config
        for arch, settings in cls.archs.items():
            register_arch(arch, dict(settings, encoder_body=name))
        return cls

    return register


def full_width_generator(num_layers: int, hidden_size: int, num_heads: int,
                         ffn_size: int) -> dict:
    """An arch's settings with DeBERTa-v3's generator (the discriminator's width, half its
    depth), so that one embedding block of the hidden size serves both networks, as the
    DeBERTa and ModernBERT transformers classes hold it."""
    return dict(num_layers=num_layers, hidden_size=hidden_size, num_heads=num_heads,
                ffn_size=ffn_size, embedding_size=hidden_size, generator_size=1.0,
                generator_layers=0.5)


def body_named(name: str) -> Type["EncoderBody"]:
    if name not in BODIES:
        raise ElectraUsageError(f"--encoder-body {name} is not an encoder body; pick one of "
                                f"{', '.join(BODIES)}")
    return BODIES[name]


class EncoderBody:
    """Builds one model's embedding blocks and encoders from its completed config.

    ``embeddings`` returns a module mapping ``(tokens, token_types)`` to B x T x E (with a
    ``word_embeddings`` attribute, which GDES and the tied heads read; ``word_embeddings``
    given: that table instead of a new one). ``encoder`` returns an
    :class:`..core.contract.Encoder`: ``encode`` over the batch's ``BatchLayout``, its
    ``layers()`` and what lies below them.
    """

    name: str = None
    options: Tuple[str, ...] = ()  # the config fields this body reads besides the sizes
    # its --arch names: {name: sizes and settings} (the hydra presets name them)
    archs: Dict[str, dict] = {}
    # settings no weight of this body depends on, which a context extension changes (a
    # checkpoint resumed at a longer length); a checkpoint of the same body loads under others
    context_settings: Tuple[str, ...] = ()
    token_types = True  # False: the body reads no token types (segment pairs go without)
    checkpoints_activations = False  # True: its encoder reads --checkpoint-activations

    def __init__(self, cfg, vocab_size: int, padding_idx: int):
        self.cfg, self.vocab_size, self.padding_idx = cfg, vocab_size, padding_idx
        for other, body in BODIES.items():  # another body's option, set: refused, not ignored
            for option in body.options:
                value = cfg.get(option, None)
                if option not in self.options and value not in (None, option_default(option)):
                    raise ElectraUsageError(
                        f"--{option.replace('_', '-')} {value} is an option of --encoder-body "
                        f"{other}, which --encoder-body {self.name} does not read; drop it or "
                        f"use --encoder-body {other}")
        if cfg.get("checkpoint_activations", False) and not self.checkpoints_activations:
            raise ElectraUsageError(
                f"--checkpoint-activations is not implemented for --encoder-body {self.name}; "
                f"drop it or use --encoder-body "
                f"{'|'.join(n for n, b in BODIES.items() if b.checkpoints_activations)}")

    @classmethod
    def complete_config(cls, cfg) -> None:
        """Fill in, in place, what this body decides in a model config (after the arch's
        sizes): a body that reads no token types has no table and reads pairs without."""
        if not cls.token_types:
            cfg.type_vocab_size, cfg.segment_token_types = 0, False

    def embeddings(self, word_embeddings=None) -> nn.Module:
        raise NotImplementedError

    def encoder(self, embeddings: nn.Module, size: EncoderSize,
                generator: bool = False) -> Encoder:
        """``generator``: the masked-LM generator's encoder (a body may decode it its own
        way: DeBERTa's enhanced mask decoder)."""
        raise NotImplementedError

    def generator_head(self, hidden_size: int, embed_tokens) -> nn.Module:
        """The generator's masked-LM head, as this body's transformers family has it."""
        return ElectraGeneratorPredictions(hidden_size, self.cfg.embedding_size, embed_tokens)

    def head_transform(self) -> Optional[nn.Module]:
        """A layer the body's task heads put before their own (None: BERT's heads)."""
        return None

    def paper_encoder_flops(self, size: EncoderSize, vocab: int, length: int,
                            positions: int, generator: bool = False) -> float:
        """Forward FLOPs of one encoder over ``positions`` positions of length-``length``
        sequences, by the paper's rules (:mod:`..core.flops`; this: BERT's encoder)."""
        return paper_encoder_flops(size, vocab, length, positions)
