"""The speed parts of fairseq's Adam wrapper, mixed in first by :func:`fast` (the plugin's
``__init__`` registers ``electra_adam`` as ``fast(ElectraAdam)``): the update over all
tensors at once (part ``adam``, :class:`~.adam.MultiTensorAdam`), the clip's norms at once
(``clip``, :mod:`.clip`), and no pass over the gradients to multiply them by exactly 1
(``multiply``)."""

import torch
from fairseq.optim.adam import Adam

from .adam import MultiTensorAdam
from .clip import clip_grad_norm_
from .switch import enabled


class FastFairseqAdam:
    """fairseq's ``FairseqAdam`` methods, each computing what fairseq's computes."""

    def __init__(self, cfg, params):
        super().__init__(cfg, params)
        # without apex's FusedAdam, fairseq's Adam loops in Python over the tensors
        if type(self._optimizer) is Adam and enabled("adam"):
            self._optimizer = MultiTensorAdam(self._optimizer.param_groups,
                                              **self.optimizer_config)

    def multiply_grads(self, c):
        """fairseq's, without its pass over every gradient when ``c`` is exactly 1 (one
        worker, one batch per update: ``sample_size`` is 1)."""
        if not torch.is_tensor(c) and c == 1 and enabled("multiply"):
            return
        super().multiply_grads(c)

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        """fairseq's, with the norms taken all at once and the clip left to the step."""
        return clip_grad_norm_(self.params, max_norm, aggregate_norm_fn, self._optimizer)


def fast(adam: type) -> type:
    """``adam`` (a ``FairseqAdam`` subclass) with :class:`FastFairseqAdam`'s methods first."""
    return type(f"Fast{adam.__name__}", (FastFairseqAdam, adam), {"__doc__": adam.__doc__})
