"""Where the replacements come from: one generator kind per file (``--generator``);
:class:`.base.GeneratorKind` is what the step calls."""

from ...user_io.errors import ElectraUsageError
from ..core.config import discriminator_size
from ..objectives import objective_named
from . import (adversarial, fast_electra, masked_lm, tied, two_stage,  # noqa: F401,E402
               two_tower, unigram, uniform)
from .base import (GENERATOR_KINDS, GeneratorKind, generator_kind,  # noqa: F401
                   generator_options, register_generator_kind)


def build_generator_kind(cfg, objective):
    """The generator kind of a completed model config, checked; None when the objective
    keeps ``<mask>`` (``mlm``)."""
    kind = generator_kind(cfg.generator)
    if objective.needs_cloze and not kind.cloze:
        cloze = ", ".join(name for name, k in GENERATOR_KINDS.items() if k.cloze)
        raise ElectraUsageError(
            f"--objective {objective.name} contrasts the data with a cloze model's noise at "
            f"every token; use --generator {cloze}, not {cfg.generator}")
    if not objective.corrupts:
        given = [option for option, default in dict(
            generator_options(), generator="masked_lm", embedding_sharing=None).items()
            if cfg.get(option, default) != default]
        if given:
            raise ElectraUsageError(
                f"--objective {objective.name} has no generator, so "
                f"--{given[0].replace('_', '-')} does not apply; drop it or pick another "
                f"--objective")
        return None
    generator = kind(cfg)
    generator.check(objective)
    return generator


def model_sizes(cfg):
    """(discriminator, generator or None) sizes of a completed model config: what the FLOPs
    counts and the benchmark need."""
    corrupts = objective_named(cfg.objective).corrupts
    return discriminator_size(cfg), generator_kind(cfg.generator)(cfg).size() if corrupts \
        else None
