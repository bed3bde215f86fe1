"""The report of a set of trials: per arm and task the judging metric's median first, mean,
std, min/max and failed runs, with an average over the tasks (and the paper's GLUE score
when GLUE tasks ran); every metric of every dev split below it, each entity type's scores
for tagging; as markdown and JSON, and a picture of every run."""

import json
import logging
import os
import statistics
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..environment.optional import require
from ..user_io.partial_output import written_whole
from .statistics import FAILED_MARGIN, Summary, format_summary, summarise

# the paper's GLUE score: Spearman for STS-B, MCC for CoLA, accuracy elsewhere; WNLI left out
GLUE_SCORE_METRIC = {"CoLA": "mcc", "STS-B": "spearman"}
GLUE_SCORE_TASKS = ("CoLA", "SST-2", "MRPC", "QQP", "STS-B", "MNLI", "QNLI", "RTE")


@dataclass
class Row:
    arm: str
    name: str  # task or dev split: MNLI, MNLI-mm, SQuAD ...
    metric: str
    seeds: List[int]
    scores: List[float]
    summary: Summary = field(init=False)
    baseline: Optional[float] = None
    judges: bool = False  # the metric the task is judged by (its kind's first)

    def __post_init__(self):
        self.summary = summarise(self.scores, self.baseline)


def report_rows(results: Sequence[dict]) -> List[Row]:
    """One row per arm, dev split and metric, over the seeds that have a result."""
    grouped: Dict[Tuple[str, str, str], List[Tuple[int, float, float]]] = {}
    judging = {}
    for r in results:
        for name, metrics in r["scores"].items():
            judging[r["arm"], name] = r.get("metric") or next(iter(metrics))
            for metric, value in metrics.items():
                grouped.setdefault((r["arm"], name, metric), []).append(
                    (r["seed"], value, r["baselines"][name][metric]))
    rows = []
    for (arm, name, metric), runs in grouped.items():
        runs.sort()
        rows.append(Row(arm, name, metric, [s for s, _, _ in runs], [v for _, v, _ in runs],
                        baseline=max(b for _, _, b in runs),
                        judges=judging[arm, name] == metric))
    return rows


def glue_score(rows: Sequence[Row], arm: str) -> Optional[Tuple[float, int]]:
    """The paper's GLUE dev score of an arm: the mean over the GLUE tasks run (WNLI aside)
    of each task's median (Spearman for STS-B, MCC for CoLA, accuracy elsewhere); with the
    number of tasks it averages, or None with fewer than two."""
    medians = [r.summary.median for r in rows if r.arm == arm and r.name in GLUE_SCORE_TASKS
               and r.metric == GLUE_SCORE_METRIC.get(r.name, "accuracy")]
    return (sum(medians) / len(medians), len(medians)) if len(medians) > 1 else None


def suite_average(rows: Sequence[Row], arm: str) -> Optional[Tuple[float, int]]:
    """The mean over an arm's tasks (dev splits) of the judging metric's median."""
    medians = [r.summary.median for r in rows if r.arm == arm and r.judges]
    return (statistics.mean(medians), len(medians)) if medians else None


def per_type(results: Sequence[dict]) -> Dict[Tuple[str, str], Dict[str, Dict[str, float]]]:
    """{(arm, task): {type: median precision, recall and F1 over the runs}} of tagging."""
    found: Dict[Tuple[str, str], Dict[str, Dict[str, List[float]]]] = {}
    for r in results:
        for name, detail in r.get("details", {}).items():
            for kind, scores in detail.get("per_type", {}).items():
                runs = found.setdefault((r["arm"], name), {}).setdefault(kind, {})
                for metric in ("precision", "recall", "f1"):
                    runs.setdefault(metric, []).append(scores[metric])
    return {key: {kind: {m: statistics.median(v) for m, v in metrics.items()}
                  for kind, metrics in types.items()} for key, types in found.items()}


def _line(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def _summary_cells(s: Summary) -> List[str]:
    return [str(s.n), f"{s.median:.2f}", f"{s.mean:.2f}", f"{s.std:.2f}", f"{s.min:.2f}",
            f"{s.max:.2f}", str(s.failed)]


def markdown(rows: Sequence[Row], results: Sequence[dict] = ()) -> str:
    head = ["runs", "median", "mean", "std", "min", "max", "failed"]
    lines = [_line(["arm", "task", "metric", *head]), _line(["---"] * 3 + ["---:"] * 7)]
    lines += [_line([r.arm, r.name, r.metric, *_summary_cells(r.summary)])
              for r in rows if r.judges]
    for arm in dict.fromkeys(r.arm for r in rows):
        average = suite_average(rows, arm)
        if average:
            lines.append(f"\n{arm}: average over {average[1]} tasks of the medians: "
                         f"{average[0]:.2f}")
        glue = glue_score(rows, arm)
        if glue:
            lines.append(f"\n{arm}: GLUE score (mean of the medians over {glue[1]} "
                         f"tasks): {glue[0]:.2f}")
    lines.append(f"\nfailed: runs within {FAILED_MARGIN:g} point of the best constant "
                 f"prediction (the majority class; 0 for correlations and MCC; empty answers "
                 f"for SQuAD; every word O for tagging)")
    lines += ["\nEvery metric:\n", _line(["arm", "task", "metric", *head]),
              _line(["---"] * 3 + ["---:"] * 7)]
    lines += [_line([r.arm, r.name, r.metric, *_summary_cells(r.summary)]) for r in rows]
    types = per_type(results)
    if types:
        lines += ["\nEntity types (medians over the runs):\n",
                  _line(["arm", "task", "type", "precision", "recall", "f1"]),
                  _line(["---"] * 3 + ["---:"] * 3)]
        lines += [_line([arm, task, kind, *(f"{m[k]:.2f}" for k in ("precision", "recall",
                                                                  "f1"))])
                  for (arm, task), found in types.items() for kind, m in found.items()]
    return "\n".join(lines) + "\n"


def write_report(rows: Sequence[Row], results: Sequence[dict], workdir: str,
                 picture: bool = False) -> Tuple[str, ...]:
    """``trials.json`` (every run and the summaries) and ``trials.md`` in ``workdir``, and
    with ``picture`` ``trials.png``; -> their paths."""
    arms = list(dict.fromkeys(r.arm for r in rows))
    averages = {arm: suite_average(rows, arm) for arm in arms}
    glue = {arm: glue_score(rows, arm) for arm in arms}
    data = {"rows": [dict(arm=r.arm, task=r.name, metric=r.metric, judges=r.judges,
                          seeds=r.seeds, scores=r.scores, **r.summary.as_dict())
                     for r in rows],
            "average": {arm: value[0] for arm, value in averages.items() if value},
            "glue_score": {arm: value[0] for arm, value in glue.items() if value},
            "per_type": [dict(arm=arm, task=task, types=found)
                         for (arm, task), found in per_type(results).items()],
            "runs": list(results)}
    paths = [os.path.join(workdir, "trials.json"), os.path.join(workdir, "trials.md")]
    with written_whole(paths[0]) as partial, open(partial, "w") as f:
        json.dump(data, f, indent=1)
    with written_whole(paths[1]) as partial, open(partial, "w") as f:
        f.write(markdown(rows, results))
    if picture:
        paths.append(os.path.join(workdir, "trials.png"))
        draw(rows, paths[-1])
    return tuple(paths)


def draw(rows: Sequence[Row], png: str) -> None:
    """Each task's runs of its judging metric, per arm, as points; the median a bar."""
    matplotlib = require("the trials' picture")
    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search, line by line
    import matplotlib.pyplot as plt

    judged = [r for r in rows if r.judges]
    tasks = list(dict.fromkeys(r.name for r in judged))
    arms = list(dict.fromkeys(r.arm for r in judged))
    fig, axes = plt.subplots(1, len(tasks), figsize=(2.6 * len(tasks) + 1, 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for x, arm in enumerate(arms):
            row = next((r for r in judged if r.name == task and r.arm == arm), None)
            if row is None:
                continue
            ax.scatter([x] * len(row.scores), row.scores, s=14, alpha=0.7)
            ax.hlines(row.summary.median, x - 0.3, x + 0.3, color="black")
            metric = row.metric
        ax.set_title(f"{task} ({metric})", fontsize=9)
        ax.set_xticks(range(len(arms)), arms, rotation=20, fontsize=8)
        ax.set_xlim(-0.6, len(arms) - 0.4)
    fig.tight_layout()
    with written_whole(png) as partial:
        fig.savefig(partial, dpi=100, format="png")
    plt.close(fig)


def print_rows(rows: Sequence[Row], echo: Callable[[str], None] = print) -> None:
    for r in rows:
        echo(f"{r.arm}, {r.name} {r.metric} over seeds {r.seeds}: {format_summary(r.summary)}")
