"""Data loader workers that stop when the epoch they serve is over.

fairseq gives each DataLoader persistent workers, which pay off when a task reuses its epoch
iterator in the next epoch. A task that does not (the electra task orders and masks each
epoch anew, and each validation makes a new iterator too) left the old iterator's workers
running. fairseq's iterator sits in a reference cycle, so only the garbage collector freed
it, and that closes the workers' queue before torch's shutdown can tell them to stop: each
stop waited out torch's 5 s timeout, about once per epoch and per validation. Here such an
iterator's workers are not persistent, and a finished epoch lets go of its DataLoader
iterator, so that torch stops them at once."""

from fairseq.data.iterators import CountingIterator
from fairseq.tasks import FairseqTask

from ..environment.wrapping import wrap_method


def install() -> None:
    """Wrap fairseq's once per process (importing the plugin twice is harmless)."""
    if not getattr(FairseqTask.get_batch_iterator, "electra_wrapper", None):
        wrap_method(FairseqTask, "get_batch_iterator", _workers_end_with_their_iterator)
        wrap_method(CountingIterator, "__next__", _let_go_when_done)


def _workers_end_with_their_iterator(original, task, dataset, *args, **kwargs):
    epoch_iter = original(task, dataset, *args, **kwargs)
    if task.dataset_to_epoch_iter.get(dataset) is not epoch_iter:  # not kept for reuse
        epoch_iter.persistent_workers = False  # read when it makes its DataLoader
    return epoch_iter


def _let_go_when_done(original, counting):
    try:
        return original(counting)
    finally:
        if not counting.has_next():  # its last batch is out (fairseq reads only n, total)
            counting._itr = iter(())  # the source's last reference
