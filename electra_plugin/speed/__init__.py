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
from .compile import BACKENDS as COMPILE_BACKENDS
from .compile import compile_encoders
from .dropout import Dropout
from .layers import run_layer
from .pretraining import PretrainingSpeed
from .sampling import sample
from . import module_walks

__all__ = ["Dropout", "project_qkv", "attention", "MultiTensorAdam", "retain_freed_memory",
           "compile_encoders", "COMPILE_BACKENDS", "pad_to_bucket", "module_walks", "sample",
           "PretrainingSpeed", "run_layer"]
