"""``torch.compile`` of the encoders (``--torch-compile``); part of :mod:`electra_plugin.speed`.

What is compiled is each encoder's ``encode`` (embeddings, projection, Transformer layers):
the same shapes for any batch up to B and T, which ``dynamic=True`` keeps symbolic so that a
batch of another size or length reuses the graph. Everything whose shape depends on the
masked count M (the generator head at the masked positions, the sampling, the losses) stays
outside, so M never recompiles. ``attn_mask`` is None for a batch without padding (SDPA may
then run flash attention) and a tensor otherwise: at most two graphs per encoder and mode.
The modules and their state-dict keys are unchanged.
"""

import torch

from .switch import enabled

BACKENDS = ("off", "inductor", "aot_eager")


def compile_encoders(model, backend: str) -> bool:
    """Compile the generator's and the discriminator's ``encode`` in place; True if it did
    (``off``, ``ELECTRA_SPEED=0`` or a model without encoders leave it eager)."""
    if backend == "off" or not enabled():
        return False
    encoders = {id(e): e for e in (getattr(model, "generator", None),
                                   getattr(model, "discriminator", None)) if e is not None}
    for encoder in encoders.values():  # a tied generator is the discriminator: once
        encoder.encode = torch.compile(encoder.encode, backend=str(backend), dynamic=True)
    return bool(encoders)
