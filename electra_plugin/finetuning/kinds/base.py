"""What a fine-tuning kind is (sentence classification, token tagging, extractive QA,
multiple choice, or one of a user's own): the one object that trials, evaluation, test
outputs and conversion ask about a task, so that adding a kind is one file and its
registration (:func:`electra_plugin.finetuning.kinds.register_kind`).

Every preparation command records what it wrote in the directory's task file
(:data:`TASK_FILE`): the kind, the task's name, its metrics (the first judges it), its
labels and the examples per split, so that ``--task NAME=DIR`` needs nothing else.
"""

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ...user_io.errors import ElectraUsageError

TASK_FILE = "finetuning_task.json"


@dataclass(frozen=True)
class PreparedTask:
    """A prepared data directory, as its task file (or, for a directory written before task
    files, the kind's reading of its layout) describes it."""

    kind: str
    name: str
    metrics: Tuple[str, ...]  # the first one judges the task (trials, --best-checkpoint-metric)
    labels: Optional[Tuple[str, ...]] = None  # None: a score (regression) or spans (QA)
    counts: Dict[str, int] = field(default_factory=dict)  # examples per split
    details: Dict[str, object] = field(default_factory=dict)  # what the kind adds
    directory: str = ""

    @property
    def metric(self) -> str:
        return self.metrics[0]

    def as_record(self) -> dict:
        record = asdict(self)
        record.pop("directory")
        return dict(record, metrics=list(self.metrics),
                    labels=None if self.labels is None else list(self.labels))


def write_task_file(directory: str, task: PreparedTask) -> str:
    path = os.path.join(directory, TASK_FILE)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(task.as_record(), f, indent=1, ensure_ascii=False)
    return path


def read_task_file(directory: str) -> Optional[PreparedTask]:
    """The directory's task file, or None when it has none."""
    path = os.path.join(directory, TASK_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        return PreparedTask(
            kind=record["kind"], name=record["name"], metrics=tuple(record["metrics"]),
            labels=None if record.get("labels") is None else tuple(record["labels"]),
            counts=dict(record.get("counts", {})), details=dict(record.get("details", {})),
            directory=os.path.abspath(directory))
    except (ValueError, KeyError, TypeError) as error:
        raise ElectraUsageError(f"{path} is not a task file a preparation command wrote "
                                f"({error}); prepare the data again") from None


class HfHead(NamedTuple):
    """A kind's head in transformers: its component in the conversion's key tables, the
    class suffix each family names (``ForTokenClassification``), the fairseq task that trains
    it and that task's default head name."""

    component: str
    suffix: str
    task: str
    head_name: str

    @property
    def architecture(self) -> str:
        """ELECTRA's class (the other families swap the prefix)."""
        return "Electra" + self.suffix


Scores = Dict[str, float]


@dataclass
class Evaluation:
    """Per dev split (a row of the report: MNLI and MNLI-mm ...): the model's scores and
    the best a constant prediction scores; ``details``: more per row (tagging's per-type
    precision, recall and F1)."""

    scores: Dict[str, Scores]
    baselines: Dict[str, Scores]
    details: Dict[str, dict] = field(default_factory=dict)


class FinetuningKind:
    """One kind of fine-tuning. A subclass sets the class attributes and implements the
    methods that raise here; the others have the common answers."""

    name: str  # how task files and --task name the kind
    title: str  # how messages name its data ("token tagging data")
    fairseq_task: str
    criterion: str
    prepare: str  # the command that makes its data, with placeholders
    epochs: float = 3  # the official fine-tuning epochs
    hf_head: Optional[HfHead] = None  # None: no transformers class serves its head
    # whether a checkpoint's heads are registered before its weights load (fairseq's
    # --load-checkpoint-heads); False where the kind's task registers the head itself
    heads_from_checkpoint: bool = True
    # the dict.txt its fairseq task reads token ids from, in a prepared directory: trials
    # compare it with the checkpoint's before anything runs
    dictionary_file: str = "dict.txt"

    def data_problem(self, directory: str, splits: Sequence[str] = ("train", "valid")
                     ) -> Optional[str]:
        """Why ``directory`` is not this kind's data with labelled ``splits``, or None."""
        raise NotImplementedError

    def dictionary_path(self, directory: str) -> Optional[str]:
        """The dictionary ``directory``'s token ids index, or None where it has none there (a
        kind of one's own that keeps it elsewhere is not compared)."""
        path = os.path.join(directory, self.dictionary_file)
        return path if os.path.isfile(path) else None

    def claims(self, name: str) -> bool:
        """Whether a task of this name is of this kind whatever its directory (GLUE's and
        SQuAD's names), so that other data is refused as not this task's."""
        return False

    def name_problem(self, name: str, directory: str) -> Optional[str]:
        """Why ``directory`` is not the data of the task ``name`` (one this kind claims), or
        None."""
        return self.data_problem(directory)

    def making(self, name: str) -> str:
        """The command that makes the data of a task ``name`` of this kind."""
        return self.prepare.replace("OUT_DIR", "DIR").replace("NAME", name)

    def describe(self, directory: str, name: str) -> PreparedTask:
        """A directory without a task file, read from its layout."""
        raise NotImplementedError

    def train_options(self, task: PreparedTask, model_args: Sequence[str]) -> List[str]:
        """fairseq-train's --task, --criterion and the options they need for ``task``."""
        raise NotImplementedError

    def evaluate(self, checkpoint: str, task: PreparedTask, cpu: bool) -> "Evaluation":
        """A fine-tuned checkpoint on each of the task's dev splits."""
        raise NotImplementedError

    def imported_task(self, data_dir: str, head_name: str, fields: dict,
                      labels: Optional[Sequence[str]]):
        """The task config of a checkpoint imported from this kind's transformers class (its
        data directory ``data_dir``, the head's name, the model's fields, the class's
        labels), or None: the discriminator's own task (masked_lm), whose dictionary the
        kind's fairseq task reads too."""
        return None

    def write_test_outputs(self, checkpoint: str, task_cfg, data: str, out_dir: str,
                           cpu: bool) -> List[str]:
        """The predictions of a fine-tuned ``checkpoint`` on ``data``'s test split(s), as the
        task's benchmark reads them, into ``out_dir``; -> the paths written."""
        raise ElectraUsageError(f"{self.title} has no test-set writer; predict with the "
                                f"kind's own command")

    def training_epochs(self, task: PreparedTask) -> float:
        return self.epochs

    def training_examples(self, task: PreparedTask) -> int:
        if "train" not in task.counts:
            raise ElectraUsageError(f"{task.directory} records no training examples; prepare "
                                    f"it again with {self.prepare.split(' ')[0]}")
        return task.counts["train"]
