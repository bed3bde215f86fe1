"""Buffers that keep their dtype when the model is cast to half precision."""

import torch.nn as nn


class FixedDtypeBuffers(nn.Module):
    """A module whose own buffers follow the model's device but never its dtype.

    ``--fp16``/``--bf16`` (and ``.half()``, ``.bfloat16()``) cast every floating tensor of the
    model. Tables and counts are not activations: the unigram generator's probabilities lose
    up to 3.2% in bf16, a FLOPs count of 1e18 needs float64. Each buffer is moved as it is,
    from its original, so no precision is lost on the way.
    """

    def _apply(self, fn, recurse=True):
        originals = dict(self._buffers)
        super()._apply(fn, recurse)
        for name, original in originals.items():
            if original is not None:
                self._buffers[name] = original.to(self._buffers[name].device)
        return self
