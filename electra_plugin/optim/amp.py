"""fairseq's ``--amp`` update with the gradients unscaled once, for the plugin's tasks.

fairseq's ``AMPOptimizer`` unscales the gradients on the torch optimizer (in
``clip_grad_norm``, which the trainer always calls) and then passes its fairseq wrapper to
``GradScaler.step``. The scaler tracks optimizers by identity, takes the wrapper for one not
yet unscaled and divides the gradients by the scale a second time, so Adam sees
``grad / scale`` and its eps weighs ``scale`` times more (at scale 128 a gradient of 1e-4
reached Adam as 7.8e-7): every fairseq optimizer under ``--amp`` is affected. Stepping the
scaler on the torch optimizer it already unscaled divides once (and once if nothing
unscaled yet), skips the step on inf/NaN and updates the scale, as fairseq meant.
"""

from fairseq.optim import FairseqOptimizer
from fairseq.optim.amp_optimizer import AMPOptimizer


def optimizer_step(optimizer) -> None:
    """The trainer's ``optimizer.step()``, with ``--amp`` unscaling once (see above)."""
    wrapped = getattr(optimizer, "fp32_optimizer", None)
    if isinstance(optimizer, AMPOptimizer) and type(wrapped).step is FairseqOptimizer.step:
        # the wrapper's step only forwards to the torch optimizer (scale 1, no groups)
        optimizer.scaler.step(optimizer.optimizer)
        optimizer.scaler.update()
    else:
        optimizer.step()
