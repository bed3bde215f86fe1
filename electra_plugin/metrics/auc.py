"""The discriminator's ROC AUC as two counts that sum over batches, workers and log intervals.

The official code reports ``disc_auc`` because accuracy sits at the all-"original" baseline
for thousands of updates while the scores already rank replaced tokens above original ones.
AUC is the share of (replaced, original) token pairs that the scores order correctly, ties
counting one half (Mann-Whitney). Each batch logs that count over its own pairs and the
number of its pairs; fairseq sums both, so the logged AUC is exact over all same-batch pairs
of the interval, identical for one worker with ``--update-freq k`` and k workers.

Why not per-class histograms in fixed bins (the summable form of ``tf.metrics.auc``): an
early or collapsed discriminator puts every logit within ~0.003 of one value near -2, and
fixed bins then tie nearly all pairs; measured on such real batches, 65,536 bins per class
still missed scikit-learn's AUC by up to 2.4e-3, while these counts are exact per batch.
"""

import torch


def auc_pair_counts(logits: torch.Tensor, replaced: torch.Tensor,
                    covered: torch.Tensor) -> torch.Tensor:
    """int64 [2 x correctly ordered pairs (ties count 1), pairs] over the covered tokens.

    Sorting and searching only, no host synchronisation.
    """
    scores = logits.detach().float().flatten()
    covered = covered.flatten()
    positive = replaced.flatten() & covered
    negative = ~replaced.flatten() & covered
    # negatives' scores in order, every other token pushed past them to +inf
    ordered = torch.where(negative, scores, float("inf")).sort().values
    below = torch.searchsorted(ordered, scores, right=False)
    not_above = torch.searchsorted(ordered, scores, right=True)
    twice_correct = ((below + not_above) * positive).sum()
    return torch.stack([twice_correct, positive.sum() * negative.sum()])


def auc_from_counts(counts) -> float:
    """AUC of summed :func:`auc_pair_counts` (0 from a meter fairseq reset between log
    lines: none); NaN when there is no pair (no replaced or no original token)."""
    twice_correct, pairs = (float(c) for c in counts) if torch.is_tensor(counts) else (0, 0)
    return twice_correct / (2 * pairs) if pairs else float("nan")
