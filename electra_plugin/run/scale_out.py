"""Runs on several machines, and runs resumed on another number of processes.

fairseq trains on several nodes (torchrun, SLURM, or ``--distributed-init-method``) but has
no hook for three things a long run needs there, so :func:`install` wraps four of its
functions; each only adds to what fairseq does (docs/long_runs.md, "Several nodes"):

- ``distributed_utils._infer_torch_distributed_launch_init``: under torchrun fairseq takes
  the device as ``RANK % cuda.device_count()``, which divides by zero on CPU workers (gloo
  runs, and this project's tests of several nodes): there the device is the CPU.
- ``Trainer.save_checkpoint``: the checkpoint records how its batches were laid out
  (processes, --update-freq, sequences or tokens per batch), next to fairseq's position in
  the epoch, which counts batches *per process*.
- ``Trainer.load_checkpoint``: every process must see the checkpoint rank 0 resumes from
  (a ``--save-dir`` on a node's own disk would leave the others starting from scratch, or
  waiting forever); the saved layout and this run's go with the epoch position to
- ``EpochBatchIterator.load_state_dict``: where fairseq restores the position (not under
  ``--reset-dataloader`` or ``--finetune-from-model``), a run resumed on another number of
  processes continues the epoch where it stopped, its position converted to the new count,
  or is refused in one line where the same batches cannot be continued. The global batch
  kept is ``--global-batch-size``'s.
"""

import logging
import os

import torch
from fairseq.data.iterators import EpochBatchIterator
from fairseq.distributed import utils as distributed_utils
from fairseq.trainer import Trainer

from ..user_io.errors import ElectraUsageError
from ..environment.wrapping import wrap_function, wrap_method

logger = logging.getLogger(__name__)

LAYOUT = "electra_data_parallel"  # the key in a checkpoint's extra_state


def install() -> None:
    """Wrap fairseq's functions once per process."""
    if getattr(Trainer.load_checkpoint, "electra_wrapper", None):
        return
    wrap_function(distributed_utils, "_infer_torch_distributed_launch_init",
                  _device_from_local_rank)
    wrap_method(Trainer, "save_checkpoint", _record_layout)
    wrap_method(Trainer, "load_checkpoint", _continue_on_this_layout)
    wrap_method(EpochBatchIterator, "load_state_dict", _restore_position)


def _device_from_local_rank(original, cfg):
    if torch.cuda.device_count():
        return original(cfg)
    # fairseq's settings for a torchrun worker, on the CPU's one device
    cfg.distributed_init_method = "env://"
    cfg.distributed_world_size = int(os.environ["WORLD_SIZE"])
    cfg.distributed_rank = int(os.environ["RANK"])
    cfg.device_id = 0
    cfg.distributed_no_spawn = True


def layout_of(trainer) -> dict:
    """How one update's batches are laid out: fairseq's position in an epoch counts batches
    of this process, so it means the same data only for the same layout."""
    dataset = trainer.cfg.dataset
    return {"world_size": trainer.data_parallel_world_size,
            "update_freq": int(trainer.cfg.optimization.update_freq[0]),
            "batch_size": dataset.batch_size, "max_tokens": dataset.max_tokens}


def _record_layout(original, trainer, filename, extra_state):
    extra_state = dict(extra_state, **{LAYOUT: layout_of(trainer)})
    return original(trainer, filename, extra_state)


def _continue_on_this_layout(original, trainer, filename, *args, **kwargs):
    _every_rank_sees(trainer, filename)
    extra_state = original(trainer, filename, *args, **kwargs)
    saved = (extra_state or {}).get(LAYOUT)
    position = (extra_state or {}).get("train_iterator")
    if saved and position:  # converted only if fairseq restores it (not --reset-dataloader,
        # not --finetune-from-model): see _restore_position
        extra_state["train_iterator"] = dict(
            position, **{LAYOUT: (saved, layout_of(trainer), filename)})
    return extra_state


def _restore_position(original, iterator, state):
    state = dict(state)
    layouts = state.pop(LAYOUT, None)
    if layouts:
        saved, now, filename = layouts
        state["iterations_in_epoch"] = continued_position(
            saved, now, state.get("iterations_in_epoch", 0), filename)
    return original(iterator, state)


def _every_rank_sees(trainer, filename) -> None:
    """Refuse, on every rank at once, a checkpoint that only some ranks can read: fairseq
    decides per rank whether to resume, and the ranks would part ways."""
    if trainer.data_parallel_world_size <= 1:
        return
    seen = torch.zeros(trainer.data_parallel_world_size, device=trainer.device)
    seen[trainer.data_parallel_rank] = float(os.path.isfile(filename))
    seen = distributed_utils.all_reduce(seen, group=trainer.data_parallel_process_group).tolist()
    if any(seen) and not all(seen):
        blind = ", ".join(str(rank) for rank, s in enumerate(seen) if not s)
        raise ElectraUsageError(
            f"{filename} is seen by rank(s) {', '.join(str(r) for r, s in enumerate(seen) if s)} "
            f"but not by rank(s) {blind}: every process must resume from the same checkpoint; "
            f"put --save-dir on a file system that every node mounts at the same path")


def continued_position(saved: dict, now: dict, consumed: int, filename) -> int:
    """The epoch position (batches of one process) that continues ``consumed`` batches per
    process of the ``saved`` layout on the layout ``now``, or one line where it cannot."""
    if (saved["batch_size"], saved["max_tokens"]) != (now["batch_size"], now["max_tokens"]):
        if not consumed:
            return 0
        raise ElectraUsageError(
            f"{filename} was saved {consumed} batches into its epoch with --batch-size "
            f"{saved['batch_size']} --max-tokens {saved['max_tokens']}, and this run makes "
            f"other batches (--batch-size {now['batch_size']} --max-tokens "
            f"{now['max_tokens']}): give the checkpoint's values to continue the epoch, or "
            f"--reset-dataloader to start it over")
    global_batch = (saved["world_size"] * saved["update_freq"],
                    now["world_size"] * now["update_freq"])
    if global_batch[0] != global_batch[1]:
        logger.warning(
            f"{filename} was trained on {global_batch[0]} batches per update ({saved['world_size']} "
            f"process(es) x --update-freq {saved['update_freq']}) and this run makes "
            f"{global_batch[1]} ({now['world_size']} x {now['update_freq']}): the global batch "
            f"changes; --global-batch-size keeps it on any number of processes")
    if saved["world_size"] == now["world_size"]:
        return consumed
    batches = consumed * saved["world_size"]  # of the epoch's one shuffled list, in order
    if batches % now["world_size"]:
        raise ElectraUsageError(
            f"{filename} was saved {batches} batches into its epoch on {saved['world_size']} "
            f"process(es), which {now['world_size']} processes cannot continue in step: resume "
            f"on {saved['world_size']} process(es) or with --global-batch-size, or pass "
            f"--reset-dataloader to start the epoch over")
    logger.info(f"resuming on {now['world_size']} process(es) where the checkpoint ran on "
                f"{saved['world_size']}: the epoch continues after its first {batches} batches")
    return batches // now["world_size"]
