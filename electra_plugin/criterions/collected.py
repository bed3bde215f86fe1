"""Dev metrics that no sum of per-batch counts gives (F1, MCC, correlations, entity F1,
SQuAD's EM/F1): each validation batch's predictions are collected in a fairseq meter, and the
metric is derived from all of them when fairseq reads the meters at the end of validation, so
that ``--best-checkpoint-metric`` can name it.

A criterion that logs collections returns lists from ``forward``: its
``logging_outputs_can_be_summed`` is False, so fairseq gathers the outputs of several
workers instead of summing them (under DDP a large validation batch may need a larger
``--all-gather-list-size``). fairseq's trainer also logs every validation step into a
``valid`` aggregator that lives as long as the run: that copy of a collection is emptied once
the metric is read, so memory holds one validation pass at most."""

from typing import Callable, Dict, List

from fairseq.logging import metrics
from fairseq.logging.meters import MetersDict


class Collected(MetersDict._DerivedMeter):
    """The items logged under one key, in the order they came. A derived meter to fairseq,
    so that checkpoints leave it out: their meters are rebuilt from fairseq's own classes
    only, and one validation pass's predictions are nothing a resumed run needs."""

    def __init__(self):
        super().__init__(lambda meters: len(self.items))
        self.items: List = []

    def update(self, items):
        self.items.extend(items)

    def reset(self):
        self.items = []


def collect(key: str, logging_outputs) -> bool:
    """Adds every output's ``key`` list to the meter ``key``; False when none has one (a
    training step)."""
    items = [item for log in logging_outputs for item in log.get(key, ())]
    if items:
        metrics.log_custom(Collected, key, items)
    return bool(items)


def log_derived_scores(key: str, score: Callable[[List], Dict[str, float]],
                       names) -> None:
    """Logs each of ``names`` as derived from the items collected under ``key`` by
    ``score`` (items -> {name: value in percent}), computed once per reading."""
    cache = {}

    def value(name):
        def read(meters):
            items = meters[key].items
            if cache.get("n") != len(items):
                cache.update(n=len(items), scores=score(items))
                lasting = metrics.get_meter("valid", key)  # the trainer's run-long copy
                if lasting is not None and lasting is not meters[key]:
                    lasting.reset()
            return round(cache["scores"].get(name, 0.0), 2)

        return read

    for name in names:
        metrics.log_derived(name, value(name))
