"""A diverging run stops with one line, and no checkpoint ever holds NaN/Inf weights.

fairseq's trainer raises ``FloatingPointError`` when an update's gradients are NaN/Inf
(fp32, bf16) or when the fp16/amp loss scale falls to ``--min-loss-scale``, and
fairseq-train ends in a traceback that names neither the update nor what to change, nor
whether the saved checkpoints are usable. :mod:`electra_plugin.run.safety_wrappers` wraps
``Trainer.train_step`` and ``Trainer.save_checkpoint`` with :func:`step_or_stop` and
:func:`save_finite_only`: the first remembers the last finite loss and turns the divergence
into the line; the second refuses to write weights that an update made NaN/Inf (a learning
rate large enough to overflow them with finite gradients), so every checkpoint in
``--save-dir`` was saved before the divergence.
"""

import logging
import math
import os

import torch

from ..user_io.errors import ElectraUsageError

logger = logging.getLogger(__name__)

# the messages of fairseq's FloatingPointErrors that mean "this run diverged" (others, such
# as gradients that differ between workers, are not divergence and keep fairseq's message)
CAUSES = {
    "gradients are Nan/Inf": "its gradients are NaN/Inf",
    "Minimum loss scale reached": "the fp16 loss scale fell to --min-loss-scale (the loss "
                                  "overflows at every scale)",
}


def step_or_stop(original, trainer, samples, *args, **kwargs):
    """``Trainer.train_step``, with its divergence as :func:`divergence_error`."""
    try:
        output = original(trainer, samples, *args, **kwargs)
    except FloatingPointError as error:
        cause = next((c for key, c in CAUSES.items() if key in str(error)), None)
        if cause is None:
            raise
        if _skipped(trainer, cause, trainer.get_num_updates() + 1):
            return None  # as fairseq-train takes an fp16 overflow: no update, the next batch
        raise divergence_error(trainer, trainer.get_num_updates() + 1, cause) from None
    loss = (output or {}).get("loss")
    if loss is not None and math.isfinite(loss):
        trainer.electra_last_finite_loss = (trainer.get_num_updates(), loss)
    return output


def skip_or_stop(trainer, update: int) -> None:
    """An update found non-finite after it ran (its checks kept on the device,
    :mod:`electra_plugin.speed.deferred`; skipped there, its weights untouched): skipped as
    ``--skip-nonfinite-updates`` allows, otherwise the divergence line."""
    cause = CAUSES["gradients are Nan/Inf"]
    if not _skipped(trainer, cause, update, zero_grad=False):
        raise divergence_error(trainer, update, cause)


def skips_left(trainer) -> int:
    """How many more non-finite updates ``--skip-nonfinite-updates`` lets this run skip."""
    return max(0, _allowed(trainer) - getattr(trainer, "electra_skipped_updates", 0))


def _allowed(trainer) -> int:
    return getattr(trainer.cfg.task, "skip_nonfinite_updates", 0) or 0


def _skipped(trainer, cause: str, update: int, zero_grad: bool = True) -> bool:
    """Whether ``--skip-nonfinite-updates`` leaves room to skip this update (then logged):
    large runs step over a rare bad batch rather than stop."""
    if not skips_left(trainer):
        return False
    trainer.electra_skipped_updates = getattr(trainer, "electra_skipped_updates", 0) + 1
    if zero_grad:
        trainer.zero_grad()
    logger.warning(f"skipped update {update}: {cause} (skip {trainer.electra_skipped_updates}"
                   f" of --skip-nonfinite-updates {_allowed(trainer)})")
    return True


def save_finite_only(original, trainer, filename, extra_state):
    """``Trainer.save_checkpoint``, refusing weights that are NaN/Inf (crash.pt included)."""
    bad = next((name for name, p in trainer.get_model().named_parameters()
                if not torch.isfinite(p).all()), None)
    if bad is not None:
        raise divergence_error(trainer, trainer.get_num_updates(),
                               f"its weights are NaN/Inf ({bad}); that state was not saved")
    return original(trainer, filename, extra_state)


def divergence_error(trainer, update: int, cause: str) -> ElectraUsageError:
    """The line: which update, the last finite loss, the checkpoints left, what to try."""
    last = getattr(trainer, "electra_last_finite_loss", None)  # (update, its loss: a
    # number, or what float() reads it from once it is needed)
    before = (f"the last finite loss was {float(last[1]):.4g}, at update {last[0]}" if last
              else "no update had finished")
    advice = _advice(trainer.cfg)
    save_dir = trainer.cfg.checkpoint.save_dir
    resume = os.path.join(save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt")
    if os.path.isfile(resume):
        saved = (f"the checkpoints in {save_dir} were saved before it and are intact: run the "
                 f"same command with {advice} to resume from {os.path.basename(resume)}")
    else:
        saved = f"no checkpoint was saved before it: start again with {advice}"
    return ElectraUsageError(f"training diverged at update {update}: {cause} ({before}); "
                             f"{saved}")


def _advice(cfg) -> str:
    """What to change, in the options of this run."""
    clip = cfg.optimization.clip_norm
    changes = ["a lower --lr", "a longer --warmup-updates",
               f"a --clip-norm below {clip:g}" if clip else "--clip-norm 1.0"]
    if cfg.common.fp16 or cfg.common.amp:
        changes.append("--bf16 or fp32 instead of --fp16/--amp")
    elif cfg.common.bf16:
        changes.append("fp32 instead of --bf16")
    return ", ".join(changes[:-1]) + " or " + changes[-1]
