"""The safety wraps of fairseq: kill-proof checkpoints, one-line errors for damaged files
and a diverging run, inside ``fairseq-train``.

fairseq-train gives a user dir no hook around its file handling, so :func:`install` (run
when ``--user-dir electra_plugin`` is imported) wraps six of fairseq's functions and two
of its trainer's methods; each wrapper only adds a check or makes a write atomic, and calls
fairseq's own code:

- ``indexed_dataset.make_dataset``: a binarized split is checked (``.idx`` against ``.bin``)
  when any task loads it, so damaged data fails at load with the file's name;
- ``PathManager.copy``: local copies (fairseq's ``checkpoint_last.pt`` / ``_best`` are
  copies of the update's checkpoint) go through a temporary file and a rename, so a kill
  during the copy leaves the previous intact file instead of a truncated one;
- ``checkpoint_utils.load_checkpoint_to_cpu``: a file that is not an intact checkpoint
  (``--restore-file``, ``--finetune-from-model``, the hub and the commands built on it) is
  named in one line saying what it is (damaged, refused by the safe unpickler, text, another
  format: :func:`~electra_plugin.models.core.checkpoint_file.not_a_checkpoint`); a checkpoint
  read keeps its model settings with its weights, for the model to compare
  (:mod:`electra_plugin.models.loading`);
- ``checkpoint_utils.load_checkpoint``: a ``--restore-file`` or ``--finetune-from-model``
  that is not a file is refused (fairseq would silently start from scratch); the run takes
  ``--save-dir`` for itself (a second
  run into it stops, :mod:`electra_plugin.run.save_dir_lock`); when ``checkpoint_last.pt`` is
  damaged, it resumes from the newest intact checkpoint there, with a warning;
- ``checkpoint_utils.save_checkpoint``: a failed write (a full disk) ends in one line
  saying the checkpoints already saved are intact;
- ``distributed_utils._broadcast_object_slow``: on a resume with several processes, rank 0
  reads the checkpoint (safely: it holds plain containers) and sends the state, whose config
  fairseq has by then made a DictConfig, to the other ranks, which unpickle it with torch's
  default ``weights_only=True`` and fail (torch >= 2.6). The bytes come from rank 0 of the
  same job, not from a file, so the receivers read them in full.
- ``Trainer.train_step`` and ``Trainer.save_checkpoint``: a diverging run stops with one
  line, and weights that became NaN/Inf are never saved (:mod:`electra_plugin.run.divergence`);
  the last checkpoint of a pre-training run whose discriminator collapsed is saved with one
  warning line (:mod:`electra_plugin.models.collapse`).

The wraps that serve speed are :mod:`electra_plugin.speed.trainer_patches`'.
"""

import glob
import io
import logging
import os
import shutil

import torch
from fairseq import checkpoint_utils
from fairseq.data import indexed_dataset
from fairseq.distributed import utils as distributed_utils
from fairseq.file_io import PathManager
from fairseq.trainer import Trainer
from omegaconf import open_dict

from ..models.collapse import warn_if_collapsed
from ..models.core.checkpoint import remember_settings
from ..models.core.checkpoint_file import checkpoint_damage, file_error, not_a_checkpoint
from ..environment.wrapping import wrap_function, wrap_method
from ..user_io.errors import ElectraUsageError
from .divergence import save_finite_only, step_or_stop
from .integrity import check_binarized
from .save_dir_lock import hold_save_dir

logger = logging.getLogger(__name__)


def install() -> None:
    """Wrap fairseq's functions once per process (importing the plugin twice is harmless)."""
    if getattr(indexed_dataset.make_dataset, "electra_wrapper", None):
        return
    wrap_function(indexed_dataset, "make_dataset", _checked_make_dataset)
    wrap_function(checkpoint_utils, "load_checkpoint_to_cpu", _named_damage)
    wrap_function(checkpoint_utils, "load_checkpoint", _resume_from_intact)
    wrap_function(checkpoint_utils, "load_checkpoint", _one_run_per_save_dir)
    wrap_function(checkpoint_utils, "load_checkpoint", _refuse_a_start_file_that_is_none)
    wrap_function(checkpoint_utils, "save_checkpoint", _one_line_write_errors)
    wrap_function(PathManager, "copy", _atomic_copy)  # a partial binds no self: static
    wrap_function(distributed_utils, "_broadcast_object_slow", _broadcast_from_own_rank)
    wrap_method(Trainer, "train_step", step_or_stop)
    wrap_method(Trainer, "save_checkpoint", save_finite_only)
    wrap_method(Trainer, "save_checkpoint", _warn_at_the_end_if_collapsed)


def _warn_at_the_end_if_collapsed(original, trainer, filename, extra_state):
    saved = original(trainer, filename, extra_state)
    model = trainer.get_model()
    last = trainer.cfg.optimization.max_update
    if getattr(model, "pretraining", False) and 0 < last <= trainer.get_num_updates() and \
            not getattr(trainer, "electra_collapse_checked", False):
        trainer.electra_collapse_checked = True  # checkpoint_last and _best: one line
        warn_if_collapsed(model, f"pre-training ended at update {trainer.get_num_updates()}",
                          "fine-tuning from it starts no better than a random initialisation; "
                          "pre-train again with a lower --lr, a longer --warmup-updates or "
                          "more updates")
    return saved


def _checked_make_dataset(original, path, impl, *args, **kwargs):
    check_binarized(path)  # whatever impl fairseq inferred: a lone .idx infers none
    return original(path, impl, *args, **kwargs)


def _atomic_copy(original, src_path, dst_path, overwrite=False):
    if PathManager.path_requires_pathmanager(src_path) or \
            PathManager.path_requires_pathmanager(dst_path):
        return original(src_path, dst_path, overwrite=overwrite)
    if os.path.exists(dst_path) and not overwrite:
        return False  # what fairseq's copy answers for an existing file
    partial = dst_path + ".tmp"
    try:
        shutil.copyfile(src_path, partial)
    except OSError:
        if os.path.exists(partial):  # a full disk: leave no half copy behind
            os.remove(partial)
        raise
    os.replace(partial, dst_path)
    return True


def _named_damage(original, path, *args, **kwargs):
    local = PathManager.get_local_path(path)
    refused = file_error(local)  # before torch reads (and warns about) it; the rest after
    # a failure, so that a checkpoint is read once
    if refused:
        raise refused
    try:
        state = original(path, *args, **kwargs)
    except Exception as error:
        refused = not_a_checkpoint(local, error)
        if refused:
            raise refused from None
        raise
    remember_settings(state, path)
    return state


def _refuse_a_start_file_that_is_none(original, cfg, trainer, **passthrough):
    # fairseq starts from scratch, silently, when the file it was told to start from is not
    # a file (a directory, a typo): the run would look like a resume and be none
    given = cfg.finetune_from_model if cfg.finetune_from_model else \
        cfg.restore_file if cfg.restore_file != "checkpoint_last.pt" else None
    if given and given == cfg.restore_file:
        given = given.replace(".pt", trainer.checkpoint_suffix + ".pt")  # as fairseq reads it
    if given and not PathManager.isfile(given):
        option = "--finetune-from-model" if cfg.finetune_from_model else "--restore-file"
        if os.path.isdir(given):
            raise ElectraUsageError(f"{option} {given} is a directory, not a checkpoint file; "
                                    f"give the .pt file in it")
        raise ElectraUsageError(f"{option} {given} does not exist; give the checkpoint file "
                                f"to start from")
    return original(cfg, trainer, **passthrough)


def _one_run_per_save_dir(original, cfg, trainer, **passthrough):
    # before anything is read or written; rank 0 holds it for a multi-process job
    if not cfg.no_save and distributed_utils.is_master(trainer.cfg.distributed_training):
        hold_save_dir(cfg.save_dir)
    return original(cfg, trainer, **passthrough)


def _broadcast_from_own_rank(original, obj, src_rank, group, dist_device):
    if distributed_utils.get_rank(group) == src_rank:
        return original(obj, src_rank, group, dist_device)
    length = torch.zeros(1, dtype=torch.long, device=dist_device)
    distributed_utils.broadcast(length, src=src_rank, group=group)
    buffer = torch.empty(int(length.item()), dtype=torch.uint8, device=dist_device)
    distributed_utils.broadcast(buffer, src=src_rank, group=group)
    return torch.load(io.BytesIO(buffer.cpu().numpy().tobytes()), map_location="cpu",
                      weights_only=False)  # rank 0's own bytes (see above)


def _resume_from_intact(original, cfg, trainer, **passthrough):
    last = os.path.join(cfg.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt")
    if cfg.restore_file != "checkpoint_last.pt" or not os.path.isfile(last):
        return original(cfg, trainer, **passthrough)
    reason = checkpoint_damage(last)
    if not reason:
        return original(cfg, trainer, **passthrough)
    intact = newest_intact_checkpoint(cfg.save_dir, exclude=last)
    if intact is None:
        raise ElectraUsageError(
            f"{last} is damaged ({reason}) and {cfg.save_dir} holds no intact checkpoint to "
            f"resume from; move the damaged file away to start this run again from scratch")
    logger.warning(f"{last} is damaged ({reason}); resuming from {intact}, the newest intact "
                   f"checkpoint in {cfg.save_dir} (the next save replaces the damaged file)")
    restore, finetune = cfg.restore_file, cfg.finetune_from_model
    with open_dict(cfg):
        cfg.restore_file, cfg.finetune_from_model = intact, None
    try:
        return original(cfg, trainer, **passthrough)
    finally:
        with open_dict(cfg):
            cfg.restore_file, cfg.finetune_from_model = restore, finetune


def newest_intact_checkpoint(save_dir, exclude=None):
    """The most recently written checkpoint*.pt in ``save_dir`` that is not damaged."""
    candidates = [p for p in glob.glob(os.path.join(save_dir, "checkpoint*.pt"))
                  if p != exclude and os.path.isfile(p)]
    for path in sorted(candidates, key=os.path.getmtime, reverse=True):
        if not checkpoint_damage(path):
            return path
    return None


def _one_line_write_errors(original, cfg, trainer, *args, **kwargs):
    try:
        return original(cfg, trainer, *args, **kwargs)
    except OSError as e:
        raise ElectraUsageError(
            f"could not write a checkpoint into {cfg.save_dir} ({e.strerror or e}); the "
            f"checkpoints already there are intact: free space (or choose another --save-dir) "
            f"and run the same command to resume") from None
