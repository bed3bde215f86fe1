"""fairseq's seeding before each step, without torch's lazy seeds; part of
:mod:`electra_plugin.speed` (``ELECTRA_SPEED=-seed``: fairseq's own).

fairseq seeds torch before every training and validation step (``Trainer._set_seed``: the
run's seed plus the update count, through ``torch.manual_seed``), so that a resumed run draws
what an uninterrupted one would. ``torch.manual_seed`` also queues the seed for every
accelerator backend that is not initialised (CUDA on a CPU run; XPU and MTIA on a GPU run),
each time with a formatted stack trace of its caller: 0.5 ms of host time per update on a
CPU thread. The generators that can draw in a fairseq run are seeded as it seeds them: the
CPU's, and every CUDA device's where CUDA is initialised (a GPU run initialises it when it
moves the model, before its first step).
"""

import torch

from .switch import enabled


def seed_drawing_devices(original, trainer) -> None:
    """``Trainer._set_seed``: its seed, given to the CPU's and the CUDA devices' generators."""
    if not enabled("seed"):
        return original(trainer)
    seed = trainer.cfg.common.seed + trainer.get_num_updates()
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)
