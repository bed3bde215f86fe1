"""Fine-tuning trials: one checkpoint (or a random initialisation) fine-tuned on each task
with several seeds, each run an ordinary ``fairseq-train`` command, each final model
evaluated on the task's dev split(s), and the runs summarised per task, median first.

The paper's dev results are medians of many fine-tuning runs; the official code's
``num_trials``. No model is picked on the dev set: every trial is evaluated as it ends
(``checkpoint_last.pt``), as the official code does. A trial that finished has its
``result.json`` in its directory and is not run again; an interrupted one resumes from its
``checkpoint_last.pt`` (fairseq's own resume).
"""

import contextlib
import json
import logging
import math
import os
import re
import shlex
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..data import conll
from ..data import multiple_choice as mc
from ..data import squad as sq
from ..data import squad_answers
from ..data.binarize import pretraining_data_problem
from ..errors import PREFIX, ElectraUsageError
from ..glue import GLUE_TASKS, constant_baseline, data_problem, get_task, score
from ..partial_output import written_whole
from ..progress import log_interval
from .checkpoint_kind import DISCRIMINATOR, PRETRAINING, read_kind
from .evaluate import sentence_predictions, squad_predictions
from .statistics import FAILED_MARGIN, Summary, format_summary, summarise

logger = logging.getLogger(__name__)

PLUGIN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SQUAD = "SQuAD"
# the official fine-tuning lr and layer-wise lr decay of each size (configure_finetuning.py);
# a size of its own (electra_tiny, size options) takes Small's
SIZE_RECIPES = {"electra_small": (3e-4, 0.8), "electra_base": (1e-4, 0.8),
                "electra_large": (5e-5, 0.9)}
DEFAULT_SIZE = "electra_small"
# official epochs: 3, 10 for RTE and STS-B (the paper's appendix), 2 for SQuAD
EPOCHS = {"RTE": 10, "STS-B": 10, SQUAD: 2}
DEFAULT_EPOCHS = 3
# the paper's GLUE score: Spearman for STS-B, MCC for CoLA, accuracy elsewhere; WNLI left out
GLUE_SCORE_METRIC = {"CoLA": "mcc", "STS-B": "spearman"}
GLUE_SCORE_TASKS = ("CoLA", "SST-2", "MRPC", "QQP", "STS-B", "MNLI", "QNLI", "RTE")
RESULT = "result.json"
SQUAD_METRICS = ("exact", "f1")  # the official evaluation's EM and F1
MAX_SEED = 2**31 - 1  # numpy's seeding (fairseq-train's) takes 0..2**32-1; the tasks add epochs
# the other data directories the preparation commands write: what each is, the command, and
# why a directory is not one (judged on its training split)
OTHER_DATA = (("SQuAD", "electra-squad preprocess", sq.data_problem),
              ("token tagging", "electra-tag preprocess", conll.data_problem),
              ("multiple-choice", "electra-choice preprocess", mc.data_problem),
              ("pre-training", "electra-prepare", pretraining_data_problem))


@dataclass(frozen=True)
class TrialTask:
    """A task to fine-tune on: a GLUE task name (the sentiment set is SST-2) or SQuAD, and
    its binarized data (electra-glue / electra-squad preprocess)."""

    name: str
    data: str

    @property
    def is_squad(self) -> bool:
        return self.name == SQUAD

    @property
    def making(self) -> str:
        """The command that makes this task's data."""
        if self.is_squad:
            return ("electra-squad preprocess --pretrain-data PRETRAIN_DATA --train TRAIN.json "
                    "--valid DEV.json --out-dir DIR")
        return (f"electra-glue preprocess --task {self.name} --glue-dir GLUE_DIR/{self.name} "
                f"--pretrain-data PRETRAIN_DATA --out-dir DIR")


def parse_task(spec: str) -> TrialTask:
    """``NAME=DIR``: a GLUE task (CoLA ... WNLI) or SQuAD, and its preprocessed data."""
    name, sep, data = spec.partition("=")
    if not sep or not data:
        raise ElectraUsageError(f"--task {spec!r} is not NAME=DIR (e.g. RTE=data-bin/RTE or "
                                f"SQuAD=data-bin/squad)")
    try:
        name = SQUAD if name.lower().startswith("squad") else get_task(name).name
    except ElectraUsageError:
        raise ElectraUsageError(f"--task {spec!r}: unknown task '{name}'; choose one of "
                                f"{', '.join(GLUE_TASKS)}, {SQUAD}") from None
    if not os.path.isdir(data):
        raise ElectraUsageError(f"--task {spec!r}: {data} is not a directory; preprocess the "
                                f"task with electra-{'squad' if name == SQUAD else 'glue'} "
                                f"preprocess")
    return TrialTask(name, os.path.abspath(data))


def data_kind(directory: str) -> Optional[Tuple[List[str], str]]:
    """What a preparation command made ``directory`` as, judged on its training split: (the
    tasks or kinds it fits, e.g. ["QNLI", "RTE"], and the command), or None."""
    glue = [t.name for t in GLUE_TASKS.values() if data_problem(t, directory, ["train"]) is None]
    if glue:
        return glue, "electra-glue preprocess"
    for name, command, problem in OTHER_DATA:
        if problem(directory, ["train"]) is None:
            return [name], command
    return None


def check_data(task: TrialTask) -> None:
    """The task's directory holds what its fine-tuning and evaluation read (the training and
    dev splits, labelled), before any run starts: else one line naming the directory, what it
    is instead or lacks, and the command that makes the right one."""
    problem = sq.data_problem(task.data) if task.is_squad else \
        data_problem(GLUE_TASKS[task.name], task.data)
    if problem is None:
        return
    if not os.listdir(task.data):
        problem = "is empty"
    else:
        kind = data_kind(task.data)
        if kind and task.name not in kind[0]:
            problem = f"is {' or '.join(kind[0])} data ({kind[1]}), not {task.name} data"
    raise ElectraUsageError(f"--task {task.name}: {task.data} {problem}; make {task.name} data "
                            f"with {task.making}")


@dataclass(frozen=True)
class Start:
    """What each trial fine-tunes: a checkpoint's discriminator, or a random initialisation
    of the same model options (``model_args``: --arch and size options)."""

    label: str  # "pre-trained", "random init" ...: the arm's name in tables
    model_args: Tuple[str, ...]
    checkpoint: Optional[str] = None

    @property
    def arch(self) -> str:
        return self.model_args[self.model_args.index("--arch") + 1]


def from_checkpoint(path: str, label: str = "pre-trained") -> Start:
    """A Start that fine-tunes ``path``, with the model options it was trained with."""
    # reads the config, runs nothing of the file
    from ..models.bodies import body_named
    from ..models.core.config import cli_options

    checkpoint = read_kind(path)
    if checkpoint.task not in (PRETRAINING, DISCRIMINATOR):
        raise checkpoint.refusal("trials fine-tune a pre-training checkpoint (task electra) or "
                                 "its discriminator (electra-extract)")
    model_cfg = checkpoint.cfg["model"]
    args = ["--arch", model_cfg.get("arch", None) or model_cfg.get("_name")]
    body = body_named(model_cfg.get("encoder_body", None) or "bert")
    args += cli_options(model_cfg, ("num_layers", "hidden_size", "num_heads", "ffn_size",
                                    "embedding_size", "max_positions", "type_vocab_size",
                                    "encoder_body", *body.options, "segment_token_types"))
    return Start(label, tuple(args), os.path.abspath(path))


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
    extra: Tuple[str, ...] = ()  # more fairseq-train options, last (they win)

    def __post_init__(self):
        """Counts checked before anything runs."""
        for option, value in (("--batch-size", self.batch_size), ("--max-update", self.max_update)):
            if value is not None and value < 1:
                raise ElectraUsageError(f"{option} {value} must be at least 1")
        if self.epochs is not None and not self.epochs > 0:
            raise ElectraUsageError(f"--epochs {self.epochs:g} must be more than 0")

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
         arm_dir: Optional[str] = None) -> List[Trial]:
    """One trial per task and seed, each in ``workdir/[arm_dir/]TASK/seed-S``; the seeds and
    each task's data checked first."""
    check_seeds(seeds)
    for task in dict.fromkeys(tasks):
        check_data(task)
    base = os.path.join(workdir, arm_dir) if arm_dir else workdir
    return [Trial(task, start, seed, os.path.join(base, task.name, f"seed-{seed}"))
            for task in tasks for seed in seeds]


def training_examples(task: TrialTask) -> int:
    """Examples (SQuAD: windows) in the task's training split."""
    if task.is_squad:
        return len(sq.SquadMetadata.load(sq.split_paths(task.data, "train")["metadata"]).windows)
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    return len(MMapIndexedDataset(os.path.join(task.data, "input0", "train")))


def finetune_command(trial: Trial, recipe: Recipe) -> List[str]:
    """The fairseq-train command line of one trial (the official recipe: Adam eps 1e-6,
    weight decay 0.01, 10% linear warm-up then linear decay to 0, clip 1.0, batch 32)."""
    task, start = trial.task, trial.start
    lr, layer_decay = recipe.size_values(start.arch)
    updates = recipe.max_update
    if updates is None:
        epochs = recipe.epochs or EPOCHS.get(task.name, DEFAULT_EPOCHS)
        updates = math.ceil(math.ceil(training_examples(task) / recipe.batch_size) * epochs)
    cmd = [sys.executable, "-m", "fairseq_cli.train", task.data, "--user-dir", PLUGIN,
           *start.model_args]
    if task.is_squad:
        cmd += ["--task", "squad", "--criterion", "squad"]
    else:
        glue = GLUE_TASKS[task.name]
        cmd += ["--task", "sentence_prediction", "--criterion", "sentence_prediction",
                "--num-classes", str(glue.num_classes), "--init-token", "0",
                "--shorten-method", "truncate"]
        if "--max-positions" not in start.model_args:  # the task's and the model's option
            cmd += ["--max-positions", "512"]
        cmd += ["--regression-target"] if glue.labels is None else []
    cmd += ["--optimizer", "electra_adam", "--adam-betas", "(0.9,0.999)", "--adam-eps", "1e-6",
            "--weight-decay", f"{recipe.weight_decay:g}", "--layer-decay", f"{layer_decay:g}",
            "--lr", f"{lr:g}", "--lr-scheduler", "polynomial_decay", "--end-learning-rate", "0",
            "--warmup-updates", str(max(1, round(recipe.warmup * updates))),
            "--total-num-update", str(updates), "--max-update", str(updates),
            "--clip-norm", "1.0", "--batch-size", str(recipe.batch_size),
            "--required-batch-size-multiple", "1", "--save-dir", trial.save_dir,
            "--no-epoch-checkpoints", "--disable-validation", "--seed", str(trial.seed),
            "--log-format", "simple", "--log-interval", "100", "--num-workers", "0",
            "--data-buffer-size", "0"]
    cmd += ["--cpu"] if recipe.cpu else []
    if start.checkpoint:
        cmd += ["--finetune-from-model", start.checkpoint]  # a re-run resumes instead
    return cmd + list(recipe.extra)


def dev_splits(task: TrialTask) -> Dict[str, str]:
    """{row name: fairseq split} of the task's dev sets (MNLI: matched and mismatched)."""
    if task.is_squad:
        return {SQUAD: "valid"}
    names = GLUE_TASKS[task.name].dev_splits
    if len(names) == 1:
        return {task.name: "valid"}
    return {task.name: "valid", **{f"{task.name}-mm": f"valid{i}"
                                   for i in range(1, len(names))}}


def evaluate(trial: Trial, cpu: bool = False) -> Tuple[Dict[str, Dict[str, float]],
                                                        Dict[str, Dict[str, float]]]:
    """-> ({row: {metric: score}}, {row: {metric: constant-prediction score}}) of the trial's
    final model on each dev split."""
    checkpoint = os.path.join(trial.save_dir, "checkpoint_last.pt")
    rows = dev_splits(trial.task)
    with quiet():
        if trial.task.is_squad:
            found = {row: squad_split(trial, checkpoint, split, cpu)
                     for row, split in rows.items()}
        else:
            found = glue_splits(trial, checkpoint, rows, cpu)
    return ({row: f[0] for row, f in found.items()}, {row: f[1] for row, f in found.items()})


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


def squad_split(trial: Trial, checkpoint: str, split: str, cpu: bool):
    """-> ({metric: score}, {metric: score of empty answers}) on one SQuAD dev split."""
    preds, meta = squad_predictions(checkpoint, trial.task.data, split, cpu)
    predicted = {qid: p.answer for qid, p in preds.items()}
    found = squad_answers.squad_scores(meta.examples, predicted)
    empty = squad_answers.squad_scores(meta.examples, {e.qid: "" for e in meta.examples})
    return {k: found[k] for k in SQUAD_METRICS}, {k: empty[k] for k in SQUAD_METRICS}


def glue_splits(trial: Trial, checkpoint: str, rows: Dict[str, str], cpu: bool):
    """-> {row: ({metric: score}, {metric: constant-prediction score})} of a GLUE-format
    task's dev splits, the model loaded once."""
    glue = GLUE_TASKS[trial.task.name]
    predicted = sentence_predictions(checkpoint, trial.task.data, list(rows.values()), cpu)
    found = {}
    for row, split in rows.items():
        preds, gold = predicted[split]
        if gold is None:
            raise ElectraUsageError(f"the {split} split of {trial.task.data} has no labels; "
                                    f"trials need a labelled dev set")
        found[row] = score(glue, preds, gold), constant_baseline(glue, gold)
    return found


def run_trials(trials: Sequence[Trial], recipe: Recipe, jobs: int = 1,
               echo: Callable[[str], None] = print) -> List[dict]:
    """Run the trials that have no result yet, ``jobs`` at a time (each with
    cpu_count // jobs threads), evaluate each as it ends; -> every trial's result."""
    pending = [t for t in trials if not finished(t, recipe)]
    for trial in trials:
        if trial not in pending:
            echo(f"(done: {trial.start.label}, {trial.task.name}, seed {trial.seed})")
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
                running.append((trial, cmd, subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
            time.sleep(0.2)
            if time.monotonic() - reported >= log_interval():
                reported = time.monotonic()
                for trial, _, _, log in running:
                    echo(f"  {trial.start.label}, {trial.task.name}, seed {trial.seed}: "
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
                echo(f"  {trial.start.label}, {trial.task.name}, seed {trial.seed}: {shown}")
    finally:
        for _, _, proc, log in running:  # an error or an interrupt stops the others too
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
    scores, baselines = evaluate(trial, recipe.cpu)
    result = {"task": trial.task.name, "arm": trial.start.label, "seed": trial.seed,
              "scores": scores, "baselines": baselines,
              "command": cmd[3:]}  # without the interpreter: a re-run by another python is the same
    with written_whole(trial.result_path) as partial, open(partial, "w") as f:
        json.dump(result, f, indent=1)
    return result


def failure_line(trial: Trial, code: int, log_path: str) -> str:
    with open(log_path, errors="replace") as f:
        lines = f.read().splitlines()
    said = [line[len(PREFIX):] for line in lines if line.startswith(PREFIX)]
    why = said[-1] if said else (lines[-1] if lines else "no output")
    return (f"fine-tuning {trial.task.name} (seed {trial.seed}, {trial.start.label}) failed "
            f"(exit {code}): {why}; its log: {log_path}")


# ---------------------------------------------------------------------------- the report
@dataclass
class Row:
    arm: str
    name: str  # task or dev split: MNLI, MNLI-mm, SQuAD ...
    metric: str
    seeds: List[int]
    scores: List[float]
    summary: Summary = field(init=False)
    baseline: Optional[float] = None

    def __post_init__(self):
        self.summary = summarise(self.scores, self.baseline)


def report_rows(results: Sequence[dict]) -> List[Row]:
    """One row per arm, dev split and metric, over the seeds that have a result."""
    rows: Dict[Tuple[str, str, str], Row] = {}
    grouped: Dict[Tuple[str, str, str], List[Tuple[int, float, float]]] = {}
    for r in results:
        for name, metrics in r["scores"].items():
            for metric, value in metrics.items():
                grouped.setdefault((r["arm"], name, metric), []).append(
                    (r["seed"], value, r["baselines"][name][metric]))
    for key, runs in grouped.items():
        runs.sort()
        rows[key] = Row(key[0], key[1], key[2], [s for s, _, _ in runs],
                        [v for _, v, _ in runs], baseline=max(b for _, _, b in runs))
    return list(rows.values())


def glue_score(rows: Sequence[Row], arm: str) -> Optional[Tuple[float, int]]:
    """The paper's GLUE dev score of an arm: the mean over the GLUE tasks run (WNLI aside)
    of each task's median (Spearman for STS-B, MCC for CoLA, accuracy elsewhere); with the
    number of tasks it averages, or None with fewer than two."""
    medians = [r.summary.median for r in rows if r.arm == arm and r.name in GLUE_SCORE_TASKS
               and r.metric == GLUE_SCORE_METRIC.get(r.name, "accuracy")]
    return (sum(medians) / len(medians), len(medians)) if len(medians) > 1 else None


def markdown(rows: Sequence[Row]) -> str:
    lines = ["| arm | task | metric | runs | median | mean | std | min | max | failed |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s = r.summary
        lines.append(f"| {r.arm} | {r.name} | {r.metric} | {s.n} | {s.median:.2f} | "
                     f"{s.mean:.2f} | {s.std:.2f} | {s.min:.2f} | {s.max:.2f} | {s.failed} |")
    for arm in dict.fromkeys(r.arm for r in rows):
        average = glue_score(rows, arm)
        if average:
            lines.append(f"\n{arm}: GLUE score (mean of the medians over {average[1]} "
                         f"tasks): {average[0]:.2f}")
    lines.append(f"\nfailed: runs within {FAILED_MARGIN:g} point of the best constant "
                 f"prediction (the majority class; 0 for correlations and MCC; empty answers "
                 f"for SQuAD)")
    return "\n".join(lines) + "\n"


def write_report(rows: Sequence[Row], results: Sequence[dict], workdir: str) -> Tuple[str, str]:
    """``trials.json`` (every run and the summaries) and ``trials.md`` in ``workdir``."""
    data = {"rows": [dict(arm=r.arm, task=r.name, metric=r.metric, seeds=r.seeds,
                          scores=r.scores, **r.summary.as_dict()) for r in rows],
            "glue_score": {arm: glue_score(rows, arm)[0] for arm in
                           dict.fromkeys(r.arm for r in rows) if glue_score(rows, arm)},
            "runs": list(results)}
    paths = os.path.join(workdir, "trials.json"), os.path.join(workdir, "trials.md")
    with written_whole(paths[0]) as partial, open(partial, "w") as f:
        json.dump(data, f, indent=1)
    with written_whole(paths[1]) as partial, open(partial, "w") as f:
        f.write(markdown(rows))
    return paths


def print_rows(rows: Sequence[Row], echo: Callable[[str], None] = print) -> None:
    for r in rows:
        echo(f"{r.arm}, {r.name} {r.metric} over seeds {r.seeds}: {format_summary(r.summary)}")

