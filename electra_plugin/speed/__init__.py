"""Where the speed work lives, every trick a named part of one switch, ``ELECTRA_SPEED``
(:data:`.switch.PARTS`, the one table of them: docs/speed.md is checked against it).

Each part computes what a plain PyTorch or fairseq op computes (tested against it in
tests/test_fast_path.py and the parts' own tests); it only does so faster. The model, task
and optimizer code uses these names and reads as its plain meaning. ``ELECTRA_SPEED=0``
turns every part off (e.g. ``ELECTRA_SPEED=0 fairseq-train ...``, to check that a result
does not depend on them), ``-PART`` one of them.
"""

from .adam import MultiTensorAdam
from .allocator import retain_freed_memory
from .buckets import pad_to_bucket
from .attention import attention, project_qkv
from .clip import clip_grad_norm_
from .compile import BACKENDS as COMPILE_BACKENDS
from .compile import compile_encoders, compile_step
from .dropout import Dropout, dropout
from .pretraining import PretrainingSpeed
from .sampling import sample
from . import module_walks
from .switch import enabled

__all__ = ["Dropout", "dropout", "project_qkv", "attention", "MultiTensorAdam",
           "clip_grad_norm_", "retain_freed_memory", "compile_encoders", "compile_step",
           "COMPILE_BACKENDS", "enabled", "pad_to_bucket", "module_walks", "sample",
           "PretrainingSpeed"]
