"""The statistics of a set of fine-tuning runs: the paper's median first, then mean, spread,
range and the runs that never left the majority-class level; and a paired comparison of two
arms fine-tuned with the same seeds.

Fine-tuning variance is large at every scale (the paper reports the median of ten runs), so a
mean of three runs can move by several points when one seed fails; the median and the count
of failed runs say what the mean hides.
"""

import statistics
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np
from scipy.stats import wilcoxon

# A run whose score is within this many points of the best constant prediction's never left
# chance (a run at 50.3 on a balanced binary task is as failed as one at 50.0).
FAILED_MARGIN = 1.0
BOOTSTRAP_SAMPLES = 10_000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Summary:
    """One metric over the runs of one task: in points, as the metrics are reported."""

    n: int
    median: float
    mean: float
    std: float  # sample standard deviation (0 for a single run)
    min: float
    max: float
    failed: int  # runs within FAILED_MARGIN of the constant-prediction baseline
    baseline: Optional[float]  # the best score a constant prediction gets

    def as_dict(self):
        return asdict(self)


def summarise(scores: Sequence[float], baseline: Optional[float] = None) -> Summary:
    if not scores:
        raise ValueError("no scores to summarise")
    scores = [float(s) for s in scores]
    failed = 0 if baseline is None else sum(s <= baseline + FAILED_MARGIN for s in scores)
    return Summary(n=len(scores), median=statistics.median(scores),
                   mean=statistics.mean(scores),
                   std=statistics.stdev(scores) if len(scores) > 1 else 0.0,
                   min=min(scores), max=max(scores), failed=failed, baseline=baseline)


@dataclass(frozen=True)
class PairedComparison:
    """Arm A minus arm B over runs paired by seed."""

    n: int
    mean_difference: float
    median_difference: float
    low: float  # the bootstrap interval of the mean difference (CONFIDENCE)
    high: float
    wilcoxon_p: Optional[float]  # two-sided signed-rank test; None when it is undefined
    verdict: str

    def as_dict(self):
        return asdict(self)


def compare_paired(a: Sequence[float], b: Sequence[float], names=("A", "B"),
                   seed: int = 0) -> PairedComparison:
    """The paired differences a[i] - b[i]: a percentile bootstrap interval of their mean
    (resampling the pairs, ``BOOTSTRAP_SAMPLES`` times from a fixed ``seed``), Wilcoxon's
    signed-rank p-value, and the verdict in words. The interval decides the verdict: with
    five pairs the signed-rank test cannot go below p = 0.0625, so it is reported, not used.
    """
    if len(a) != len(b) or not a:
        raise ValueError(f"paired runs need the same number of scores in each arm "
                         f"({len(a)} and {len(b)})")
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(BOOTSTRAP_SAMPLES, len(d)))].mean(1)
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = (float(x) for x in np.percentile(means, [tail, 100 - tail]))
    p = None
    if len(d) > 1 and np.any(d != 0):
        p = float(wilcoxon(d).pvalue)
    mean = float(d.mean())
    first, second = names
    interval = f"{CONFIDENCE:.0%} interval {low:+.2f}..{high:+.2f}"
    if low > 0 or high < 0:
        ahead, behind = (first, second) if mean > 0 else (second, first)
        verdict = f"{ahead} ahead of {behind} by {abs(mean):.2f} points ({interval})"
    else:
        verdict = (f"no difference this budget can detect: {first} - {second} = {mean:+.2f} "
                   f"points, {interval}")
    return PairedComparison(n=len(d), mean_difference=mean,
                            median_difference=float(np.median(d)), low=low, high=high,
                            wilcoxon_p=p, verdict=verdict)


def format_summary(s: Summary) -> str:
    """``median 73.67 | mean 65.50 +- 14.90 | min 48.30 max 74.53 | 1 of 3 failed``"""
    failed = "" if s.baseline is None else f" | {s.failed} of {s.n} failed"
    return (f"median {s.median:.2f} | mean {s.mean:.2f} +- {s.std:.2f} | "
            f"min {s.min:.2f} max {s.max:.2f}{failed}")
