"""The whole training update as one compiled function; part of :mod:`electra_plugin.speed`.

fairseq's update runs the task's forward and backward once per micro-batch of
``--update-freq``, then in Python: ``multiply_grads`` by 1 / sample_size, the clip (norm and
coefficient), the finiteness check and the optimizer's step at the lr its scheduler set. Each
of these is host work, and on a GPU each op is a kernel launch. Here all of it is one
function compiled with ``fullgraph=True, dynamic=False``, which a GPU can replay as one CUDA
graph:

- each micro-batch's forward and backward, the gradients taken inside the graph
  (:meth:`~.compile.GraphedStep.with_gradients`), summed over the micro-batches;
- fairseq's ``multiply_grads`` and clip (``clip_grad_norm_``: the fp32 norm, then
  ``min(1, max_norm / (norm + 1e-6))``);
- :class:`~.capturable_adam.CapturableAdam`'s update, skipped on the device where the norm
  is not finite (weights, moments and step counts left as they are, as fairseq leaves them).

Nothing in it reads the host. The lr comes from a device table that the host writes at each
update (:meth:`WholeUpdate.set_lr`: the lrs fairseq's scheduler set at the host's count).
The host counts an update skipped on the device until it reads the flags; the graph picks
the row of fairseq's count, the host's less the skips not yet read (``late``), as
speed/deferred.py does for the eager update.
"""

import logging

import torch

from ..user_io.errors import ElectraUsageError
from .clip import _total_norm
from .compile import own_code, unguarded_structure

logger = logging.getLogger(__name__)


class WholeUpdate:
    """One update of micro-batches, compiled whole at its first call; a call whose
    micro-batches differ from the first call's in number or shape (an epoch's short last
    batch or update) runs the same function eager rather than compiling again.

    ``step``: the model's :class:`~.compile.GraphedStep`, which must take the gradients
    inside its graph; ``adam``: a :class:`~.capturable_adam.CapturableAdam` over the
    parameters the step takes gradients of (all of them); ``clip_norm``: fairseq's
    ``--clip-norm`` (0: the norm alone); ``window``: how many updates the host may run
    before it reads the skip flags (:meth:`read`), at most ``window - 1`` of them skipped.
    """

    def __init__(self, step, adam, clip_norm: float, backend: str, window: int):
        if not step.takes_gradients():
            raise ElectraUsageError(
                "the whole update needs the graphed step to take its gradients inside its "
                "graph (an unscaled loss, ELECTRA_SPEED's gradients part on, no parameter "
                "registered in two modules); train without it or meet those")
        where = {id(p): i for i, p in enumerate(step.params)}
        held = [p for group in adam.groups for p in group.params]
        if len(held) != len(step.params) or any(id(p) not in where for p in held):
            raise ElectraUsageError(
                "the whole update's Adam must hold exactly the parameters the step trains "
                "(frozen or resting parameters break this); train without the whole update")
        self.order = [[where[id(p)] for p in group.params] for group in adam.groups]
        self.step, self.adam, self.clip_norm, self.window = step, adam, clip_norm, window
        self.shapes, self.said_eager = None, False
        device = adam.lr.device
        # the host writes (fill_) into these, never rebinds them: a captured graph reads
        # them. (1-D: dynamo would take a 0-dim CPU tensor for a number and guard on it)
        self.lrs = torch.zeros(window, len(adam.groups), dtype=torch.float64, device=device)
        self.count = torch.zeros(1, dtype=torch.int64, device=device)  # the host's count
        self.late = torch.zeros(1, dtype=torch.int64, device=device)  # skips not yet read
        self.compiled = torch.compile(own_code(self.update), backend=backend, fullgraph=True,
                                      dynamic=False,
                                      options={"guard_filter_fn": unguarded_structure})

    def set_lr(self, count: int, lrs) -> None:
        """Before the update that follows ``count`` updates (as the host counts them):
        ``lrs``, each group's lr as fairseq's scheduler set it at that count."""
        self.count.fill_(count)
        row = self.lrs[count % self.window]
        for index, lr in enumerate(lrs):
            row[index].fill_(lr)

    def __call__(self, batches):
        """One update of ``batches`` (tuples ``(src_tokens, target, masked_positions,
        masked_weights)``) -> (each micro-batch's training fields and loss, the gradient
        norm, found_inf: 1.0 where the update was skipped), all on the device."""
        batches = tuple(tuple(b) for b in batches)
        shapes = tuple(tuple(t.shape) for b in batches for t in b)
        self.shapes = self.shapes or shapes
        run = self.compiled
        if shapes != self.shapes:
            run = self.update
            if not self.said_eager:
                logger.info(f"the whole update: micro-batches of other shapes than the "
                            f"graph's ({len(batches)} of {batches[0][0].shape[0]} rows) "
                            f"run eager")
                self.said_eager = True
        with torch.no_grad():  # the graph takes the gradients: no autograd around it
            return run(self.step.values, batches)

    def read(self) -> int:
        """The host's read of the skips since the last one (one sync): the number
        skipped; the device count of them starts again at 0."""
        late = int(self.late)
        self.late.zero_()
        return late

    def update(self, values, batches):
        grads, fields = None, []
        for src_tokens, *args in batches:
            own, out = self.step.with_gradients(values, src_tokens, *args, True)
            grads = own if grads is None else torch._foreach_add(grads, own)
            fields.append(out)
        if len(batches) > 1:  # fairseq's multiply_grads by 1 / sample_size (1 per batch)
            torch._foreach_mul_(grads, 1.0 / len(batches))
        norm = _total_norm(grads)
        clip = (self.clip_norm / (norm + 1e-6)).clamp(max=1.0) if self.clip_norm > 0 else \
            torch.ones_like(norm)
        found_inf = (~torch.isfinite(norm)).float()
        # the lr at fairseq's count: the host's less the skips it has not read
        row = torch.remainder(self.count - self.late, self.window)
        self.adam.lr.copy_(self.lrs.index_select(0, row)[0])
        self.adam.update([[grads[i] for i in order] for order in self.order], found_inf, clip)
        self.late.add_(found_inf.long())
        return fields, norm, found_inf

