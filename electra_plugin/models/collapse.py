"""Whether a pre-trained discriminator's features still depend on its input.

A pre-training run that collapsed (the discriminator answering "original" everywhere from
features that no longer depend on the tokens) leaves a checkpoint that fine-tunes no better
than a random initialisation, and sometimes worse. The check: the spread of the
discriminator's mean-pooled features over random token sequences (the validation metric
``disc_feature_spread``), against the spread a fresh random initialisation of the same size
gives on the same sequences. Both run in eval mode, under a forked random stream, so a run's
own randomness (and its exact resume) is untouched.
"""

import logging

import torch

logger = logging.getLogger(__name__)

# collapsed: below this fraction of a random initialisation's spread
COLLAPSE_RATIO = 0.1
PROBE_SEQUENCES = 16
PROBE_LENGTH = 32


def pooled_spread(hidden: torch.Tensor) -> float:
    """The root mean variance over sequences of the mean-pooled features, over the norm of
    their mean (as ``disc_feature_spread``); hidden: B x T x H."""
    pooled = hidden.double().mean(1)
    return float(pooled.var(0).mean().sqrt() / pooled.mean(0).norm().clamp(min=1e-12))


@torch.no_grad()
def input_dependence(model):
    """-> (the discriminator's spread, a random initialisation's spread) on the same random
    token sequences."""
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        tokens = torch.randint(model.nspecial, model.vocab_size,
                               (PROBE_SEQUENCES, PROBE_LENGTH), device=device)
        tokens[:, 0] = model.bos_idx
        tokens[:, -1] = model.separator_idx
        fresh = model.fresh_discriminator().to(device)
        spreads = []
        for encoder in (model.discriminator, fresh):
            was_training = encoder.training
            encoder.eval()
            hidden, _ = encoder(tokens)
            encoder.train(was_training)
            spreads.append(pooled_spread(hidden))
    return spreads[0], spreads[1]


def warn_if_collapsed(model, when: str, advice: str) -> bool:
    """One warning line when the discriminator's features are collapsed; -> whether."""
    spread, random_spread = input_dependence(model)
    if spread >= COLLAPSE_RATIO * random_spread:
        return False
    logger.warning(
        f"{when}: the discriminator's features barely depend on its input (feature spread "
        f"{spread:.2g} on random tokens, {random_spread / max(spread, 1e-30):.0f}x below a "
        f"random initialisation's {random_spread:.2g}): its pre-training collapsed; {advice}")
    return True
