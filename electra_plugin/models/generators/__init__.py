"""Where the replacements come from: one class per generator variant, one file each
(``--generator``); :class:`.base.Generator` is what the step calls."""

from ..core.config import discriminator_size
from .base import GENERATORS, Generator, register_generator  # noqa: F401
from . import adversarial, fast_electra, masked_lm, tied, two_stage, unigram  # noqa: F401,E402


def build_generator(cfg, objective):
    """The generator variant of a completed model config, checked; None when the objective
    keeps ``<mask>`` (``mlm``)."""
    if not objective.corrupts:
        return None
    generator = GENERATORS[cfg.generator](cfg)
    generator.check(objective)
    return generator


def model_sizes(cfg):
    """(discriminator, generator or None) sizes of a completed model config: what the FLOPs
    counts and the benchmark need."""
    generator = GENERATORS[cfg.generator](cfg)
    return discriminator_size(cfg), None if cfg.objective == "mlm" else generator.size()
