"""Examples in a new random order each epoch, drawn from (seed, epoch) alone, so that a run
resumed in its third epoch orders that epoch as the uninterrupted run does. (fairseq's
masked_lm draws the order once, when the split is loaded, from the epoch it is loaded in: a
straight run keeps epoch 1's order while a resumed one takes the order of the epoch it
resumes in.)"""

import numpy as np
from fairseq.data import BaseWrapperDataset, data_utils


class EpochShuffleDataset(BaseWrapperDataset):
    """``dataset`` ordered by ``sizes`` (shortest first; fairseq batches by size), ties in
    an order drawn anew each epoch from ``seed`` and the epoch."""

    def __init__(self, dataset, sizes, seed: int):
        super().__init__(dataset)
        self.order_sizes, self.seed, self.epoch = np.asarray(sizes), seed, 1

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return False  # each epoch its own order, so its own batches

    def set_epoch(self, epoch):
        super().set_epoch(epoch)
        self.epoch = epoch

    def ordered_indices(self):
        with data_utils.numpy_seed(self.seed + self.epoch):
            shuffle = np.random.permutation(len(self))
        return np.lexsort([shuffle, self.order_sizes])
