"""The pre-training objectives of the paper's ablations (section 3.2, Table 5), one class
each (``--objective``); :class:`.base.Objective` is what the step calls."""

from .base import (OBJECTIVES, Objective, PretrainingOutput, masked_mean,  # noqa: F401
                   objective_named, register_objective)
from . import all_tokens_mlm, electric, mlm, rtd  # noqa: F401,E402
