"""Fine-tuning trials: one checkpoint (or a random initialisation) fine-tuned on each task
(of any fine-tuning kind, :mod:`.kinds`) with several seeds, each run an ordinary
``fairseq-train`` command, each final model evaluated on the task's dev split(s) by the
task's own metric, and the runs summarised per task, median first (:mod:`.report`).

The paper's dev results are medians of many fine-tuning runs; the official code's
``num_trials``. By default no model is picked on the dev set: every trial is evaluated as it
ends (``checkpoint_last.pt``), as the official code does (``keep="best"``: the best on dev,
named so in the tables). A trial that finished has its ``result.json`` in its directory and
is not run again; an interrupted one resumes from its ``checkpoint_last.pt`` (fairseq's own
resume).
"""

import contextlib
import json
import logging
import math
import os
import re
import shlex
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..data.binarize import pretraining_data_problem
from ..data.glue import GLUE_TASKS, data_problem, get_task
from ..optim.layer_decay import check_layer_decay
from ..run.stop_signals import stopped_by_signals
from ..speed.launch import start_fairseq_train
from ..user_io.errors import PREFIX, ElectraUsageError
from ..user_io.partial_output import written_whole
from ..user_io.progress import log_interval
from .checkpoint_kind import DISCRIMINATOR, PRETRAINING, read_kind
from .kinds import KINDS, FinetuningKind, PreparedTask, kind_named, prepared_task

logger = logging.getLogger(__name__)

PLUGIN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the official fine-tuning lr and layer-wise lr decay of each size (configure_finetuning.py);
# a size of its own (electra_tiny, size options) takes Small's
SIZE_RECIPES = {"electra_small": (3e-4, 0.8), "electra_base": (1e-4, 0.8),
                "electra_large": (5e-5, 0.9)}
DEFAULT_SIZE = "electra_small"
RESULT = "result.json"
MAX_SEED = 2**31 - 1  # numpy's seeding (fairseq-train's) takes 0..2**32-1; the tasks add epochs
KEEP = ("final", "best")  # the model a trial evaluates: its last, or its best on dev
BEST_ON_DEV = " (best on dev)"  # what the tables add to an arm that kept the best


@dataclass(frozen=True)
class TrialTask:
    """A task to fine-tune on: its name in the tables (a GLUE name keeps the official
    recipe, a SQuAD name is SQuAD's), and its prepared data."""

    name: str
    data: str
    prepared: Optional[PreparedTask] = field(default=None, compare=False)

    @property
    def claimed(self) -> Optional[FinetuningKind]:
        """The kind whose name this is (GLUE's, SQuAD's), whatever the directory holds."""
        return next((k for k in KINDS.values() if k.claims(self.name)), None)

    @property
    def kind(self) -> Optional[FinetuningKind]:
        return self.claimed or (None if self.prepared is None else
                                kind_named(self.prepared.kind))

    @property
    def making(self) -> str:
        """The command that makes this task's data."""
        if self.kind is None:
            return "one of " + ", ".join(k.prepare.split(" --")[0] for k in KINDS.values())
        return self.kind.making(self.name)


def parse_task(spec: str) -> TrialTask:
    """``NAME=DIR``: a task's name and the data a preparation command wrote. A GLUE name
    (CoLA ... WNLI) is that GLUE task with its official recipe; any other name takes the
    kind the directory records (its task file) or has the layout of."""
    name, sep, data = spec.partition("=")
    if not sep or not data or not name:
        raise ElectraUsageError(f"--task {spec!r} is not NAME=DIR (e.g. RTE=data-bin/RTE, "
                                f"SQuAD=data-bin/squad or ner=data-bin/my-ner)")
    try:
        name = get_task(name).name
    except ElectraUsageError:
        pass  # a task of the user's own, named as the user likes
    if not os.path.isdir(data):
        raise ElectraUsageError(f"--task {spec!r}: {data} is not a directory; prepare the "
                                f"task's data first ({TrialTask(name, data).making})")
    prepared = prepared_task(data, name)
    if prepared is not None:  # the tables' name is the user's
        prepared = PreparedTask(**{**prepared.__dict__, "name": name})
    return TrialTask(name, os.path.abspath(data), prepared)


def data_kind(directory: str) -> Optional[Tuple[List[str], str]]:
    """What a preparation command made ``directory`` as, judged on its training split: (the
    tasks or kinds it fits, e.g. ["QNLI", "RTE"], and the command), or None."""
    glue = [t.name for t in GLUE_TASKS.values() if data_problem(t, directory, ["train"]) is None]
    if glue:
        return glue, "electra-glue preprocess"
    for kind in KINDS.values():
        if kind.data_problem(directory, ["train"]) is None:
            return [kind.title], kind.prepare.split(" --")[0]
    if pretraining_data_problem(directory, ["train"]) is None:
        return ["pre-training"], "electra-prepare"
    return None


def check_data(task: TrialTask) -> None:
    """The task's directory holds what its fine-tuning and evaluation read (the training and
    dev splits, labelled), before any run starts: else one line naming the directory, what it
    is instead or lacks, and the command that makes the right one."""
    if task.kind is None:
        problem = "is no task's data (no kind's files)"
    elif task.claimed is not None:
        problem = task.claimed.name_problem(task.name, task.data)
    else:
        problem = task.kind.data_problem(task.data)
    if problem is None:
        return
    if not os.listdir(task.data):
        problem = "is empty"
    elif task.claimed is not None:
        found = data_kind(task.data)
        if found and task.name not in found[0] and task.claimed.title not in found[0]:
            problem = f"is {' or '.join(found[0])} data ({found[1]}), not {task.name} data"
    raise ElectraUsageError(f"--task {task.name}: {task.data} {problem}; make {task.name} data "
                            f"with {task.making}")


@dataclass(frozen=True)
class Start:
    """What each trial fine-tunes: a checkpoint's discriminator, or a random initialisation
    of the same model options (``model_args``: --arch and size options)."""

    label: str  # "pre-trained", "random init" ...: the arm's name in tables
    model_args: Tuple[str, ...]
    checkpoint: Optional[str] = None
    # the checkpoint's pre-training data (its task's data, as recorded) and its vocabulary
    # size (its token embeddings' rows): what the tasks' data must match
    pretraining_data: Optional[str] = field(default=None, compare=False)
    vocabulary: Optional[int] = field(default=None, compare=False)

    @property
    def dictionary(self) -> Optional[str]:
        """The pre-training data's dict.txt, or None where it is not on this machine."""
        if self.pretraining_data is None:
            return None
        path = os.path.join(self.pretraining_data, "dict.txt")
        return path if os.path.isfile(path) else None

    @property
    def arch(self) -> str:
        return self.model_args[self.model_args.index("--arch") + 1]


def from_checkpoint(path: str, label: str = "pre-trained") -> Start:
    """A Start that fine-tunes ``path``, with the model options it was trained with."""
    # reads the config, runs nothing of the file
    from ..models.bodies import discriminator_options
    from ..models.core.config import cli_options

    checkpoint = read_kind(path)
    if checkpoint.task not in (PRETRAINING, DISCRIMINATOR):
        raise checkpoint.refusal("trials fine-tune a pre-training checkpoint (task electra) or "
                                 "its discriminator (electra-extract)")
    model_cfg = checkpoint.cfg["model"]
    args = ["--arch", model_cfg.get("arch", None) or model_cfg.get("_name")]
    args += cli_options(model_cfg, (*discriminator_options(model_cfg), "segment_token_types"))
    return Start(label, tuple(args), os.path.abspath(path), pretraining_data(checkpoint),
                 checkpoint.vocabulary)


def pretraining_data(checkpoint) -> Optional[str]:
    """The data directory the checkpoint was trained on (``task.data``; its first, as fairseq
    reads the dictionary), or None where it records none."""
    from fairseq.utils import split_paths

    task = checkpoint.cfg.get("task", None)
    data = task.get("data", None) if task is not None else None
    return os.path.abspath(split_paths(str(data))[0]) if data else None


def random_init(model_args: Sequence[str], label: str = "random init") -> Start:
    if "--arch" not in model_args:
        raise ElectraUsageError("a random initialisation needs --arch (e.g. electra_small)")
    return Start(label, tuple(model_args))


@dataclass(frozen=True)
class Recipe:
    """Fine-tuning hyper-parameters; None: the official value for the size or task."""

    lr: Optional[float] = None
    layer_decay: Optional[float] = None
    epochs: Optional[float] = None
    max_update: Optional[int] = None  # instead of epochs
    batch_size: int = 32
    warmup: float = 0.1  # fraction of the updates
    weight_decay: float = 0.01
    cpu: bool = False
    keep: str = "final"  # the model evaluated: the last (the paper's) or the best on dev
    user_dir: str = PLUGIN  # a --user-dir module of one's own kinds imports the plugin
    extra: Tuple[str, ...] = ()  # more fairseq-train options, last (they win)

    def __post_init__(self):
        """Counts checked before anything runs."""
        for option, value in (("--batch-size", self.batch_size), ("--max-update", self.max_update)):
            if value is not None and value < 1:
                raise ElectraUsageError(f"{option} {value} must be at least 1")
        if self.epochs is not None and not self.epochs > 0:
            raise ElectraUsageError(f"--epochs {self.epochs:g} must be more than 0")
        if self.lr is not None and not self.lr > 0:
            raise ElectraUsageError(f"--lr {self.lr:g} must be more than 0")
        if self.layer_decay is not None:
            check_layer_decay(self.layer_decay)
        if self.keep not in KEEP:
            raise ElectraUsageError(f"--keep {self.keep} is not one of {', '.join(KEEP)}")

    @property
    def checkpoint(self) -> str:
        """The file a trial's evaluation reads."""
        return "checkpoint_best.pt" if self.keep == "best" else "checkpoint_last.pt"

    def size_values(self, arch: str) -> Tuple[float, float]:
        lr, decay = SIZE_RECIPES.get(arch, SIZE_RECIPES[DEFAULT_SIZE])
        return (lr if self.lr is None else self.lr,
                decay if self.layer_decay is None else self.layer_decay)


@dataclass(frozen=True)
class Trial:
    task: TrialTask
    start: Start
    seed: int
    save_dir: str
    recipe: Optional[Recipe] = None  # the task's own (a suite's overrides); None: the run's

    @property
    def arm(self) -> str:
        """The arm's name in the tables."""
        keep = (self.recipe or Recipe()).keep
        return self.start.label + (BEST_ON_DEV if keep == "best" else "")

    @property
    def result_path(self) -> str:
        return os.path.join(self.save_dir, RESULT)


def check_seeds(seeds: Sequence[int]) -> List[int]:
    """At least one seed, none twice, each one fairseq-train takes."""
    seeds = list(seeds)
    if not seeds:
        raise ElectraUsageError("no seeds: give --seeds S ... or --trials N")
    if len(set(seeds)) != len(seeds):
        raise ElectraUsageError(f"--seeds {' '.join(map(str, seeds))} repeats a seed")
    wrong = [s for s in seeds if not 0 <= s <= MAX_SEED]
    if wrong:
        raise ElectraUsageError(f"--seeds {wrong[0]}: a seed is a whole number from 0 to "
                                f"{MAX_SEED}")
    return seeds


def plan(tasks: Sequence[TrialTask], start: Start, seeds: Sequence[int], workdir: str,
         arm_dir: Optional[str] = None,
         recipes: Optional[Dict[str, Recipe]] = None) -> List[Trial]:
    """One trial per task and seed, each in ``workdir/[arm_dir/]TASK/seed-S``; the seeds, the
    task names, each task's data and its dictionary checked first. ``recipes``: a task's own
    recipe, by its name."""
    check_seeds(seeds)
    base = os.path.join(workdir, arm_dir) if arm_dir else workdir
    check_task_names(tasks, base)
    for task in tasks:
        check_data(task)
    check_dictionaries(tasks, start)
    recipes = recipes or {}
    return [Trial(task, start, seed, os.path.join(base, task.name, f"seed-{seed}"),
                  recipes.get(task.name)) for task in tasks for seed in seeds]


def check_task_names(tasks: Sequence[TrialTask], base: str) -> None:
    """Each task name once: a task's runs live in BASE/NAME/seed-S and its row in the tables
    is its name, so a second task of the name would take over the first one's runs."""
    seen = {}
    for task in tasks:
        first = seen.setdefault(task.name, task)
        if first is not task:
            raise ElectraUsageError(
                f"--task {task.name} is given twice ({task.name}={first.data} and "
                f"{task.name}={task.data}); its runs would share "
                f"{os.path.join(base, task.name)}: give each task once, under a name of its "
                f"own (e.g. --task {task.name}-2={task.data})")


def dictionary_symbols(path: str) -> List[str]:
    """The tokens of a dict.txt by id, as the tasks read it (``<mask>`` added)."""
    from ..data.dictionary import load_dictionary

    return list(load_dictionary(os.path.dirname(path)).symbols)


def _difference(mine: List[str], theirs: List[str], whose: str) -> str:
    if len(mine) != len(theirs):
        return f"{len(mine)} entries here, {len(theirs)} in {whose}"
    index = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
    return f"id {index} is {mine[index]!r} here, {theirs[index]!r} in {whose}"


def dictionary_problem(path: str, start: Start) -> Optional[str]:
    """How the dictionary at ``path`` differs from the one ``start``'s checkpoint was
    pre-trained with: its entries against the pre-training data's dict.txt, or, where that is
    not here or no longer the checkpoint's (another size than its embeddings), its size
    against the checkpoint's embeddings; None when they agree."""
    if start.checkpoint is None:
        return None
    mine = dictionary_symbols(path)
    theirs = dictionary_symbols(start.dictionary) if start.dictionary else None
    if theirs is not None and start.vocabulary in (None, len(theirs)):
        if mine == theirs:
            return None
        differs = _difference(mine, theirs, "the checkpoint's")
        return (f"{path} is not the dictionary the checkpoint was pre-trained with, "
                f"{start.dictionary} ({differs})")
    if start.vocabulary is None or len(mine) == start.vocabulary:
        return None
    why = f"its pre-training data, {start.pretraining_data}, is not here to compare the " \
          f"entries" if theirs is None else f"{start.dictionary} has {len(theirs)} now"
    return (f"{path} gives {len(mine)} entries with <mask> but the checkpoint's vocabulary "
            f"has {start.vocabulary} ({why})")


def check_dictionaries(tasks: Sequence[TrialTask], start: Start) -> None:
    """Each task's data was binarized with the dictionary of the model it fine-tunes, before
    anything runs: a checkpoint's token ids are rows of its embeddings, and data of another
    dict.txt of the same size would fine-tune on scrambled tokens without an error. From a
    checkpoint, that is its pre-training data's dict.txt; from --arch, the arm's tasks share
    one (the pre-training data the arm is compared with)."""
    first = None  # (task, its dictionary's path, its tokens): --arch's reference
    for task in dict.fromkeys(tasks):
        path = task.kind.dictionary_path(task.data)
        if path is None:
            continue
        if start.checkpoint is not None:
            problem = dictionary_problem(path, start)
            if problem is None:
                continue
            pretraining = start.pretraining_data or "PRETRAIN_DATA"
            raise ElectraUsageError(
                f"--task {task.name}: {problem}: its data was binarized with another "
                f"dictionary; make {task.name} data again from the checkpoint's pre-training "
                f"data: {task.making.replace('PRETRAIN_DATA', pretraining)}")
        mine = dictionary_symbols(path)
        if first is None:
            first = task, path, mine
        elif mine != first[2]:
            other, theirs = first[0], first[1]
            differs = _difference(mine, first[2], f"--task {other.name}'s")
            raise ElectraUsageError(
                f"--task {task.name}: {path} is not the dictionary of --task {other.name}, "
                f"{theirs} ({differs}): one arm's tasks are binarized with one pre-training "
                f"data's dictionary; make {task.name} data again with the --pretrain-data "
                f"{other.name}'s was made with: {task.making}")


def finetune_command(trial: Trial, recipe: Recipe) -> List[str]:
    """The fairseq-train command line of one trial (the official recipe: Adam eps 1e-6,
    weight decay 0.01, 10% linear warm-up then linear decay to 0, clip 1.0, batch 32; the
    task's options from its kind). The trial's own recipe, when it has one, wins."""
    recipe = trial.recipe or recipe
    task, start = trial.task, trial.start
    kind, prepared = task.kind, task.prepared
    lr, layer_decay = recipe.size_values(start.arch)
    updates = recipe.max_update
    if updates is None:
        epochs = recipe.epochs or kind.training_epochs(prepared)
        examples = kind.training_examples(prepared)
        updates = math.ceil(math.ceil(examples / recipe.batch_size) * epochs)
    cmd = [sys.executable, "-m", "fairseq_cli.train", task.data, "--user-dir", recipe.user_dir,
           *start.model_args, *kind.train_options(prepared, start.model_args)]
    cmd += ["--optimizer", "electra_adam", "--adam-betas", "(0.9,0.999)", "--adam-eps", "1e-6",
            "--weight-decay", f"{recipe.weight_decay:g}", "--layer-decay", f"{layer_decay:g}",
            "--lr", f"{lr:g}", "--lr-scheduler", "polynomial_decay", "--end-learning-rate", "0",
            "--warmup-updates", str(max(1, round(recipe.warmup * updates))),
            "--total-num-update", str(updates), "--max-update", str(updates),
            "--clip-norm", "1.0", "--batch-size", str(recipe.batch_size),
            "--required-batch-size-multiple", "1", "--save-dir", trial.save_dir,
            "--no-epoch-checkpoints", "--seed", str(trial.seed),
            "--log-format", "simple", "--log-interval", "100", "--num-workers", "0",
            "--data-buffer-size", "0"]
    if recipe.keep == "best":  # validated each epoch and at the end; the task's own metric
        cmd += ["--best-checkpoint-metric", prepared.metric, "--maximize-best-checkpoint-metric"]
    else:
        cmd += ["--disable-validation"]
    cmd += ["--cpu"] if recipe.cpu else []
    if start.checkpoint:
        cmd += ["--finetune-from-model", start.checkpoint]  # a re-run resumes instead
    return cmd + list(recipe.extra)


def evaluate(trial: Trial, recipe: Recipe):
    """The trial's model (its last, or its best on dev) on each dev split: an
    :class:`~.kinds.Evaluation`."""
    recipe = trial.recipe or recipe
    checkpoint = os.path.join(trial.save_dir, recipe.checkpoint)
    with quiet():
        return trial.task.kind.evaluate(checkpoint, trial.task.prepared, recipe.cpu)


@contextlib.contextmanager
def quiet():
    """fairseq's loading messages and the data loader's warnings kept out of the report."""
    logging.disable(logging.INFO)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


@stopped_by_signals()
def run_trials(trials: Sequence[Trial], recipe: Recipe, jobs: int = 1,
               echo: Callable[[str], None] = print) -> List[dict]:
    """Run the trials that have no result yet, ``jobs`` at a time (each with
    cpu_count // jobs threads), evaluate each as it ends; -> every trial's result."""
    pending = [t for t in trials if not finished(t, recipe)]
    for trial in trials:
        if trial not in pending:
            echo(f"(done: {trial.arm}, {trial.task.name}, seed {trial.seed})")
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs))
    running = []  # (trial, command, process, log file)
    reported = time.monotonic()
    try:
        while pending or running:
            while pending and len(running) < jobs:
                trial = pending.pop(0)
                cmd = finetune_command(trial, recipe)
                os.makedirs(trial.save_dir, exist_ok=True)
                echo("$ " + " ".join(shlex.quote(c) for c in cmd))
                log = open(os.path.join(trial.save_dir, "train.log"), "a")
                env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
                running.append((trial, cmd, start_fairseq_train(cmd, log, env), log))
            time.sleep(0.2)
            if time.monotonic() - reported >= log_interval():
                reported = time.monotonic()
                for trial, _, _, log in running:
                    echo(f"  {trial.arm}, {trial.task.name}, seed {trial.seed}: "
                         f"{training_progress(log.name)}")
            for entry in [e for e in running if e[2].poll() is not None]:
                running.remove(entry)
                trial, cmd, proc, log = entry
                log.close()
                if proc.returncode:
                    raise ElectraUsageError(failure_line(trial, proc.returncode, log.name))
                result = finish(trial, cmd, recipe)
                shown = "; ".join(f"{row} " + ", ".join(f"{m} {v:.2f}" for m, v in s.items())
                                  for row, s in result["scores"].items())
                echo(f"  {trial.arm}, {trial.task.name}, seed {trial.seed}: {shown}")
    finally:
        for _, _, proc, log in running:  # an error, an interrupt or SIGTERM stops the others
            proc.kill()
            proc.wait()
            log.close()
    return [json.load(open(t.result_path)) for t in trials]


def training_progress(log_path: str) -> str:
    """``update N, loss L`` of the last training line fairseq-train wrote into a run's log
    (``--log-interval`` updates apart), or that it has not logged an update yet."""
    with open(log_path, "rb") as f:
        f.seek(max(0, os.path.getsize(log_path) - 16384))
        tail = f.read().decode("utf-8", errors="replace")
    for line in reversed(tail.splitlines()):
        updates, loss = (re.search(pattern, line) for pattern in
                         (r"\bnum_updates[=\s]+(\d+)", r"\bloss[=\s]+(-?[\d.]+)"))
        if updates and loss and "valid" not in line:
            return f"update {updates.group(1)}, loss {loss.group(1)}"
    return "starting (no update logged yet)"


def finished(trial: Trial, recipe: Recipe) -> bool:
    """Whether the trial has its result; one of another recipe in its directory is refused."""
    if not os.path.isfile(trial.result_path):
        return False
    with open(trial.result_path) as f:
        done = json.load(f)
    if done.get("command") != finetune_command(trial, recipe)[3:]:
        raise ElectraUsageError(
            f"{trial.save_dir} holds a trial of another fine-tuning command (see its "
            f"{RESULT}); give these trials another --out-dir")
    return True


def finish(trial: Trial, cmd: List[str], recipe: Recipe) -> dict:
    found = evaluate(trial, recipe)
    result = {"task": trial.task.name, "kind": trial.task.kind.name,
              "metric": trial.task.prepared.metric, "arm": trial.arm, "seed": trial.seed,
              "scores": found.scores, "baselines": found.baselines, "details": found.details,
              "command": cmd[3:]}  # without the interpreter: a re-run by another python is the same
    with written_whole(trial.result_path) as partial, open(partial, "w") as f:
        json.dump(result, f, indent=1)
    return result


def failure_line(trial: Trial, code: int, log_path: str) -> str:
    with open(log_path, errors="replace") as f:
        lines = f.read().splitlines()
    said = [line[len(PREFIX):] for line in lines if line.startswith(PREFIX)]
    why = said[-1] if said else (lines[-1] if lines else "no output")
    return (f"fine-tuning {trial.task.name} (seed {trial.seed}, {trial.arm}) failed "
            f"(exit {code}): {why}; its log: {log_path}")
