"""What the ``electra`` task asks of speed/, at the three moments the task sees: the model
built (``--graphed-step``, ``--torch-compile``), the criterion built (its loss rule, which a
graphed step takes its gradients of), and the first update (the optimizer, a DDP wrapper
and the device known)."""

import functools
import logging
import os

from fairseq.optim.amp_optimizer import AMPOptimizer

from .allocator import retain_freed_memory
from .compile import compile_encoders, compile_step
from .switch import VARIABLE, enabled

logger = logging.getLogger(__name__)


class PretrainingSpeed:
    """The task's one entry into speed/; ``graphed``: ``--graphed-step``, ``backend``:
    ``--torch-compile`` (a graphed step's backend: inductor where that is ``off``),
    ``keep_cpu_memory``: not ``--release-cpu-memory``."""

    def __init__(self, graphed: bool, backend: str, keep_cpu_memory: bool):
        self.graphed, self.backend, self.keep_cpu_memory = graphed, backend, keep_cpu_memory
        self.step = None  # the model's GraphedStep, once built

    def model_built(self, model) -> None:
        asked = (["--graphed-step"] if self.graphed else []) + \
            ([f"--torch-compile {self.backend}"] if self.backend != "off" else [])
        if asked and not enabled():
            logger.warning(f"{VARIABLE}={os.environ[VARIABLE]} turns {' and '.join(asked)} "
                           f"off: the model runs eager (unset {VARIABLE} to use them)")
        if self.graphed and compile_step(model, "inductor" if self.backend == "off"
                                         else self.backend):
            self.step = model.electra_step
        elif compile_encoders(model, self.backend):
            logger.info(f"--torch-compile {self.backend}: the encoders compile at their first "
                        f"batch")

    def criterion_built(self, criterion) -> None:
        if self.step is not None and hasattr(criterion, "combine"):
            # the graph takes the gradients of the criterion's loss, by the criterion's rule
            # (until the first update finds the loss scaled)
            self.step.combine = functools.partial(criterion.combine, self.step.eager.__self__)

    def first_update(self, model, optimizer, device_type: str) -> None:
        if self.step is not None:
            if scales_loss(optimizer):  # fp16 gradients must be taken of the scaled loss:
                self.step.combine = None  # autograd's backward
            # no DDP wrapper (its hooks watch autograd's accumulation): the step adds its
            # gradients to the parameters itself
            self.step.accumulates = model is self.step.eager.__self__
        if device_type == "cpu" and self.keep_cpu_memory and retain_freed_memory():
            logger.info("CPU training: freed memory stays in the process for the next "
                        "update (glibc mallopt); --release-cpu-memory turns this off")


def scales_loss(optimizer) -> bool:
    """Whether fairseq's optimizer multiplies the loss before the backward (--fp16, --amp;
    --bf16 does not)."""
    return getattr(optimizer, "scaler", None) is not None or \
        isinstance(optimizer, AMPOptimizer)
