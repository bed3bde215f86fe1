"""The wraps of fairseq's Trainer that serve speed, installed once when the plugin is imported
(the safety wraps are :mod:`electra_plugin.run.safety_wrappers`'; docs/design.md lists both).

- ``clip_grad_norm``, ``_reduce_and_log_stats``, ``train_step``, ``save_checkpoint`` and
  ``metrics.get_smoothed_values``: an update's checks and logs kept on the device until
  ``--log-interval`` (:mod:`.deferred`);
- ``_set_seed``: fairseq's per-step seed without torch's lazy seeds (:mod:`.seed`);
- ``train_step`` (inside the deferred wrap): the whole update as one graph
  (:mod:`.whole_update`).
"""

from fairseq.logging import metrics
from fairseq.trainer import Trainer

from ..environment.wrapping import wrap_function, wrap_method
from . import deferred
from .seed import seed_drawing_devices
from .whole_update import whole_update_step


def install(on_nonfinite, skips_left) -> None:
    """Wrap the Trainer once per process; ``on_nonfinite(trainer, update)``: what becomes of
    a deferred update found non-finite, ``skips_left(trainer)``: how many more the run may
    skip (see :data:`.deferred.on_nonfinite`). Installed after the safety wraps, so that
    pending updates are settled before a checkpoint is checked."""
    deferred.on_nonfinite, deferred.skips_left = on_nonfinite, skips_left
    if getattr(Trainer._set_seed, "electra_wrapper", None):
        return
    wrap_method(Trainer, "clip_grad_norm", deferred.norm_on_device)
    wrap_method(Trainer, "_reduce_and_log_stats", deferred.hold_logs)
    wrap_method(Trainer, "train_step", whole_update_step)  # (its logs settled outside it)
    wrap_method(Trainer, "train_step", deferred.settle_at_log_interval)
    wrap_method(Trainer, "save_checkpoint", deferred.settle_before_saving)
    wrap_function(metrics, "get_smoothed_values", deferred.settle_before_reading)
    wrap_method(Trainer, "_set_seed", seed_drawing_devices)
