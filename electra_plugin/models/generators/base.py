"""What a generator variant is: the interface :meth:`ElectraModel.electra_step` calls.

A variant owns everything about where the replacements come from: the options it reads (and
the refusal of those it does not), the modules it adds to the model (under the names the
checkpoints and HF keys use: ``generator``, ``generator_head``, ``generator_baseline``,
``unigram``), its sampling temperature, its loss, its hooks on the update count and on
loading, and its share of the training FLOPs.
"""

import functools
from typing import Dict, Optional, Type

from ...user_io.errors import ElectraUsageError
from ..core.config import EncoderSize, discriminator_size, option_default
from ..core.flops import paper_generator_output

GENERATOR_KINDS: Dict[str, Type["GeneratorKind"]] = {}


def register_generator_kind(name):
    """Class decorator: ``--generator name`` builds this kind."""
    def register(cls):
        cls.name = name
        GENERATOR_KINDS[name] = cls
        return cls

    return register


def generator_kind(name: str) -> Type["GeneratorKind"]:
    if name not in GENERATOR_KINDS:
        raise ElectraUsageError(f"--generator {name} is not a generator kind; pick one of "
                                f"{', '.join(GENERATOR_KINDS)}")
    return GENERATOR_KINDS[name]


def generator_options() -> Dict[str, object]:
    """{option: default} of the options some registered kind reads (the others refuse
    them when they differ from the default)."""
    return {option: option_default(option)
            for kind in (GeneratorKind, *GENERATOR_KINDS.values()) for option in kind.reads}


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


class GeneratorKind:
    """The default behaviour: a network generator trained with the discriminator."""

    name: str
    # the model options this kind uses (others refuse them); every kind samples, so every
    # kind also reads the base's: the sampling options
    reads = ("temperature", "disallow_correct")
    embedding_sharing = ("shared",)  # --embedding-sharing values it allows; first: default
    binary_only = False  # defined for replaced token detection only
    objectives = ()  # the only objectives it is defined for (empty: any)
    # a cloze model (Electric's noise): ``propose`` reads the original tokens, not the
    # masked input, and gives q(x_t | the other tokens) at every token
    cloze = False
    masked_lm_encoder = False  # its network is a masked LM (make_encoder(generator=True))
    # what its losses log: per-batch values averaged over batches, counts summed over
    # batches, and rates (name, numerator count, denominator count) derived from them
    logged_means = ()
    logged_counts = ()
    logged_rates = ()

    def __init__(self, cfg):
        self.cfg = cfg
        self.fixed_temperature = cfg.get("temperature", 1.0)  # a plain value for the step

    # -------------------------------------------------------------- configuration

    def check(self, objective) -> None:
        """Raise one line for an option this variant does not read or cannot honour."""
        reads = self.reads + GeneratorKind.reads
        for option, default in generator_options().items():
            if option not in reads and self.cfg.get(option, default) != default:
                raise ElectraUsageError(
                    f"{_flag(option)} does not apply to --generator {self.name}; drop it or "
                    f"pick a generator that reads it")
        sharing = self.cfg.get("embedding_sharing", None)
        if sharing is not None and sharing not in self.embedding_sharing:
            raise ElectraUsageError(
                f"--generator {self.name} works with --embedding-sharing "
                f"{' or '.join(self.embedding_sharing)}, not {sharing}; drop "
                f"--embedding-sharing")
        if self.binary_only and not objective.binary:
            raise ElectraUsageError(
                f"--generator {self.name} is defined for replaced token detection, not "
                f"--objective {objective.name}; use --objective electra or electra_15")
        if self.objectives and objective.name not in self.objectives:
            raise ElectraUsageError(
                f"--generator {self.name} is defined for --objective "
                f"{' or '.join(self.objectives)}, not {objective.name}")

    @property
    def sharing(self) -> str:
        """The embedding sharing in effect."""
        return self.cfg.get("embedding_sharing", None) or self.embedding_sharing[0]

    def size(self) -> Optional[EncoderSize]:
        """The generator network's size (None: no network)."""
        return None

    @functools.cached_property
    def network_size(self) -> Optional[EncoderSize]:
        """:meth:`size`, found once (the config does not change): the FLOPs count of every
        update reads it, and the config's lookups cost 0.15 ms."""
        return self.size()

    def complete_run(self, run) -> None:
        """Check or complete the run's settings (precision, DDP) for this variant."""

    # -------------------------------------------------------------- building

    def build(self, model, dictionary, shared_embeddings) -> None:
        """Add this variant's modules to ``model`` (after the discriminator's heads)."""

    # -------------------------------------------------------------- the step

    def propose(self, model, src_tokens, layout, positions, token_types=None):
        """-> (M x V fp32 log-probabilities at the M masked positions, M baseline logits or
        None); ``layout``: the batch's :class:`..core.contract.BatchLayout` (the
        discriminator reads the same one); ``token_types``: B x T segments (None: type 0). A
        ``cloze`` kind is given the
        original tokens and no positions, and gives B x T x V: every token's."""
        raise NotImplementedError

    def temperature(self) -> float:
        """The sampling temperature at this update."""
        return self.fixed_temperature

    def sampling_temperature(self):
        """What the step samples at: :meth:`temperature`, or a 0-d tensor holding it where it
        changes every update (a compiled step reads a tensor as an input; a number it would
        compile anew for each value)."""
        return self.temperature()

    def loss(self, model, out, per_token):
        """-> (the generator's loss or None when it learns nothing, its logs); ``per_token``:
        the B x T discriminator loss of a binary objective (None otherwise)."""
        return None, {}

    def trains(self, model) -> bool:
        """Whether the generator learns at this update."""
        return False

    def runs_discriminator(self, model) -> bool:
        """Whether the discriminator runs at this update."""
        return True

    # -------------------------------------------------------------- hooks

    def set_num_updates(self, model, num_updates: int) -> None:
        pass

    def before_step(self, model) -> None:
        """The host's work before each step, outside a compiled one: reads of stored flags,
        weights loaded from a file."""

    def loaded(self, model) -> None:
        """After the model loaded a state dict."""

    def resting_parameters(self, model):
        """Parameters that require a gradient but must not move at this update."""
        return []

    def paper_flops(self, model, vocab: int, length: int, positions: int,
                    predicted: float) -> float:
        """This variant's training FLOPs as the paper counts them (forward and backward
        when it learns, forward only when frozen)."""
        size = self.size()
        if size is None:
            return 0.0
        passes = 2 if self.trains(model) else 1
        return passes * (model.body.paper_encoder_flops(size, vocab, length, positions,
                                                        generator=self.masked_lm_encoder)
                         + predicted * paper_generator_output(size, vocab))

    def disc_size(self) -> EncoderSize:
        return discriminator_size(self.cfg)


def frozen(module) -> None:
    """No gradient for ``module``'s parameters, ever (fairseq's optimizer then skips them)."""
    for p in module.parameters():
        p.requires_grad_(False)
