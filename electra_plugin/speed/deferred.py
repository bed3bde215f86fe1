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
  meters, :func:`settle` reads every pending update's flag at once, logs the finite ones as
  fairseq would have and hands each other one to :data:`on_nonfinite` (the plugin installs
  run/divergence.py's: skip it or stop the run);
- until then the host counts a skipped update, so where the run may skip one
  (:data:`skips_left`), each update takes its lr and Adam's bias corrections at fairseq's
  count, picked on the device (:func:`behind`): the lr schedule is fairseq's.

fp16/amp (loss scaling reads the norm), ``--bf16`` weights (fairseq's wrapper scales the
norm), other optimizers and several workers (fairseq compares their norms) keep fairseq's
checks.
"""

import weakref
from typing import NamedTuple

import torch
from fairseq import metrics

from .adam import Behind, MultiTensorAdam
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
    adam = trainer.optimizer.optimizer
    adam.found_inf = held.found_inf
    adam.behind = behind(trainer, adam)
    return held


def behind(trainer, adam):
    """A :class:`~.adam.Behind` for the next update where pending updates may have been
    skipped (None where none can be): each group's lr at the host's count less the pending
    ones skipped, from the lrs fairseq's scheduler set at the counts of this interval (kept
    here, one row per update), picked on the device. A run with no skips left stops at the
    first non-finite update, so its later updates need no lr of their own."""
    room = skips_left(trainer)
    if not room:
        return None
    rows = trainer.__dict__.setdefault("electra_lrs", [])  # the interval's, this one's last
    rows.append([group["lr"] for group in adam.param_groups])
    pending = trainer.__dict__.get("electra_pending", [])
    room = min(room, len(pending))
    if not room:
        return None
    late = torch.stack([p.norm.found_inf for p in pending]).sum().clamp(max=room)
    table = torch.tensor(rows[-room - 1:], dtype=torch.float32)  # counts now-room .. now
    if late.is_cuda:  # copied without the host waiting for the device
        table = table.pin_memory().to(late.device, non_blocking=True)
    return Behind(late, table.index_select(0, (room - late).long().view(1))[0])


class Pending(NamedTuple):
    """An update whose logs wait for the host's next read; ``float()`` of it is its loss as
    fairseq logs it (per sample_size, 3 decimals): one read."""

    update: int  # its number as the trainer counted it
    logging_outputs: list
    sample_size: float
    norm: DeviceNorm

    def __float__(self) -> float:
        total = sum(log.get("loss", 0) for log in self.logging_outputs)
        return round(float(total) / max(float(self.sample_size), 1.0), 3)


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


def _nonfinite(trainer, update: int) -> None:
    raise FloatingPointError(f"gradients are Nan/Inf (update {update})")  # fairseq's words


def _no_skips(trainer) -> int:
    return 0  # fairseq's: the first non-finite update stops the run


# what becomes of an update found non-finite when settled: fairseq's error by default; the
# plugin installs run/divergence.py's skip_or_stop (speed/trainer_patches.py)
on_nonfinite = _nonfinite
# how many more non-finite updates a run may skip (the plugin installs run/divergence.py's)
skips_left = _no_skips


def settle(trainer) -> bool:
    """The host's read of the updates kept pending on the device (one sync for all): the
    finite ones are logged into the meters active now; each non-finite one (skipped on the
    device, its weights untouched) goes to :data:`on_nonfinite`, which stops the run or lets
    it be skipped: taken back from the update count and Adam's step count, as fairseq
    counts. False if the last one was skipped."""
    pending = take_pending(trainer)
    if not pending:
        return True
    bad = torch.stack([p.norm.found_inf for p in pending]).tolist()
    skipped = 0
    for update, nonfinite in zip(pending, bad):
        number = update.update - skipped  # as fairseq counts: skipped updates do not count
        if nonfinite:
            on_nonfinite(trainer, number)
            skipped += 1
        else:
            log_update(trainer, update)
            trainer.electra_last_finite_loss = (number, update)  # read if the run stops
    whole = trainer.__dict__.get("electra_whole_update")
    if whole:  # (speed/whole_update.py) its Adam's counts are right; its skips are read
        whole.update.skips_read()
    if skipped:
        trainer.set_num_updates(trainer.get_num_updates() - skipped)
        if not whole:
            for state in trainer.optimizer.optimizer.state.values():
                state["step"] -= skipped
    return not bad[-1]


def take_pending(trainer) -> list:
    """The trainer's pending updates, oldest first; it holds none after this."""
    _WITH_PENDING.discard(trainer)
    trainer.__dict__.pop("electra_lrs", None)
    return trainer.__dict__.pop("electra_pending", [])


def settle_at_log_interval(original, trainer, samples, *args, **kwargs):
    """``Trainer.train_step``: the pending updates settled at ``--log-interval``; None
    (fairseq-train's "no update") when the last of them was skipped."""
    output = original(trainer, samples, *args, **kwargs)
    if not trainer.__dict__.get("electra_pending") or \
            trainer.get_num_updates() % trainer.cfg.common.log_interval:
        return output
    return output if settle(trainer) else None


def settle_before_saving(original, trainer, filename, extra_state):
    """``Trainer.save_checkpoint``: the pending updates settled first (a divergence among
    them stops the run before anything is written)."""
    settle(trainer)
    return original(trainer, filename, extra_state)


def settle_before_reading(original, *args, **kwargs):
    """``metrics.get_smoothed_values``: the pending updates of every trainer are in the
    meters before anyone reads them (the end of an epoch, a caller's own read)."""
    for trainer in list(_WITH_PENDING):
        settle(trainer)
    return original(*args, **kwargs)


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
