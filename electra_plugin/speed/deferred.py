"""An update that the host never waits for: the trainer's per-update checks kept on the
device; part of :mod:`electra_plugin.speed` (``ELECTRA_SPEED=-deferred``: fairseq's checks).

After every update fairseq's trainer reads the device three times: whether the gradient norm
is finite (to stop), again before logging it, and every meter's smoothed value for the dict
``train_step`` returns (fairseq-train only tests it for None). Each read stops the host
until the GPU has caught up, so it cannot queue the next update's kernels. With
``electra_adam`` as the trainer's optimizer (fp32 or ``--autocast-bf16``, one worker):

- ``Trainer.clip_grad_norm`` hands the trainer a :class:`DeviceNorm`: fairseq's test
  ``torch.isfinite(norm).all()`` answers on the host, and the update of a non-finite norm
  is skipped on the device instead (torch's fused Adam with ``found_inf``: weights, moments
  and weight decay untouched);
- ``Trainer._reduce_and_log_stats`` keeps the update's logs (device tensors) pending;
- at ``--log-interval``, before a checkpoint is written and whenever fairseq reads its
  meters, :func:`electra_plugin.run.divergence.settle` reads every pending update's flag
  at once, logs the finite ones as fairseq would have and skips or stops at the others.

fp16/amp (loss scaling reads the norm), ``--bf16`` weights (fairseq's wrapper scales the
norm), other optimizers and several workers (fairseq compares their norms) keep fairseq's
checks.
"""

import weakref
from typing import NamedTuple

import torch
from fairseq import metrics

from .adam import MultiTensorAdam
from .switch import enabled


class DeviceNorm:
    """The gradient norm as the trainer sees it: a host-side stand-in whose finiteness test
    (``not torch.isfinite(norm).all()``) answers "finite" without reading the device;
    ``norm`` and ``found_inf`` (1.0 when not finite), the real values, stay on it."""

    def __init__(self, norm: torch.Tensor):
        self.norm = norm
        self.found_inf = (~torch.isfinite(norm)).float()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.isfinite:
            return args[0]
        raise TypeError(f"{func.__name__} of a gradient norm kept on the device")

    def all(self):
        return self

    def __bool__(self):
        return True  # a non-finite update is skipped on the device and counted by settle


def deferrable(trainer) -> bool:
    """Whether this trainer's update can keep its checks on the device (see above)."""
    optimizer = trainer.optimizer
    wrapped = any(hasattr(optimizer, name) for name in ("fp32_optimizer", "wrapped_optimizer"))
    return enabled("deferred") and not wrapped and \
        isinstance(getattr(optimizer, "optimizer", None), MultiTensorAdam) and \
        trainer.data_parallel_world_size == 1 and \
        not (trainer.tpu or trainer.cfg.optimization.use_bmuf)


def norm_on_device(original, trainer, clip_norm):
    """``Trainer.clip_grad_norm``: a :class:`DeviceNorm` where the update is deferrable,
    its ``found_inf`` handed to the optimizer's next step."""
    norm = original(trainer, clip_norm)
    if not deferrable(trainer):
        return norm
    held = DeviceNorm(norm)
    trainer.optimizer.optimizer.found_inf = held.found_inf
    return held


class Pending(NamedTuple):
    """An update whose logs wait for the host's next read."""

    update: int  # its number as the trainer counted it
    logging_outputs: list
    sample_size: float
    norm: DeviceNorm


def hold_logs(original, trainer, logging_outputs, sample_size, grad_norm=None):
    """``Trainer._reduce_and_log_stats``: an update with a :class:`DeviceNorm` is kept
    pending (``settle`` logs it); what fairseq-train reads of the result is that it is not
    None."""
    if not isinstance(grad_norm, DeviceNorm):
        return original(trainer, logging_outputs, sample_size, grad_norm)
    pending = trainer.__dict__.setdefault("electra_pending", [])
    if not pending:  # a speed meter's clock starts at its first entry: start ups and wps at
        # the interval's first update, as fairseq would, not when settle logs them all
        metrics.log_speed("ups", 0.0, priority=100, round=2)
        if any("ntokens" in log for log in logging_outputs):
            metrics.log_speed("wps", 0.0, priority=90, round=1)
    pending.append(Pending(trainer.get_num_updates(), logging_outputs, sample_size, grad_norm))
    _WITH_PENDING.add(trainer)
    return {"sample_size": sample_size}


_WITH_PENDING = weakref.WeakSet()  # trainers holding pending updates


def take_pending(trainer) -> list:
    """The trainer's pending updates, oldest first; it holds none after this."""
    _WITH_PENDING.discard(trainer)
    return trainer.__dict__.pop("electra_pending", [])


def trainers_with_pending() -> list:
    return list(_WITH_PENDING)


def log_update(trainer, pending: Pending) -> None:
    """What fairseq's ``_reduce_and_log_stats`` logs of a finite update, into the meters
    active now."""
    metrics.log_speed("ups", 1.0, priority=100, round=2)
    metrics.log_scalar("gnorm", pending.norm.norm, priority=400, round=3)
    clip = trainer.cfg.optimization.clip_norm
    if clip > 0:
        metrics.log_scalar("clip", (pending.norm.norm > clip).float() * 100, priority=500,
                           round=1)
    with metrics.aggregate():
        trainer.task.reduce_metrics(pending.logging_outputs, trainer.get_criterion())


def mean_loss(pending: Pending) -> float:
    """The update's loss as fairseq logs it (per sample_size, 3 decimals): one read."""
    total = sum(log.get("loss", 0) for log in pending.logging_outputs)
    return round(float(total) / max(float(pending.sample_size), 1.0), 3)
