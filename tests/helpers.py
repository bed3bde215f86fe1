"""Plain helpers shared by the test modules (fixtures live in conftest.py): the tiny
templated corpus, small fairseq-train / hydra command lines, log parsing, tiny models and
batches, and the GLUE / SQuAD / tokenizer inputs several modules write. Test modules import
from here, never from each other."""

import argparse
import functools
import hashlib
import io
import json
import logging
import os
import random
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary
from fairseq.optim.amp_optimizer import AMPOptimizer
from omegaconf import OmegaConf
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

from electra_plugin.convert import model_cli_args
from electra_plugin.models.electra import ElectraModel
from electra_plugin.optim.layer_decay import ElectraAdamConfig
from electra_plugin.run.save_dir_lock import release_save_dirs
from electra_plugin.tasks.electra_pretraining import ElectraPretrainingConfig, ElectraPretrainingTask
from electra_plugin.user_io.errors import ElectraUsageError, usage_error_in_chain
from forkserver import ForkedProcess, forkable, set_limits

# ------------------------------------------------------------- corpus, commands

REPO = Path(__file__).resolve().parents[1]
PLUGIN = str(REPO / "electra_plugin")
SUBJECTS = ["the cat", "a dog", "my neighbour", "the old man", "a small child", "the teacher",
            "our team", "the river", "a red bird", "the city council"]
VERBS = ["sees", "likes", "builds", "paints", "follows", "answers", "watches", "carries"]
OBJECTS = ["a house", "the ball", "an apple", "the long road", "a quiet song", "the letter",
           "two boxes", "the green door", "a warm coat", "the morning news"]
TAILS = ["today", "in the park", "near the station", "after dinner", "with great care",
         "every winter", "before the storm", ""]


def write_corpus(path: Path, sentences: int, seed: int) -> None:
    """Templated sentences, a blank line between documents of 8 lines."""
    rng = random.Random(seed)
    lines = []
    for i in range(sentences):
        words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(TAILS)]
        lines.append(" ".join(w for w in words if w) + " .")
        if i % 8 == 7:
            lines.append("")
    path.write_text("\n".join(lines) + "\n")


def binarize(text_dir: Path, dest: Path, splits=("train", "valid")) -> Path:
    """fairseq-preprocess --only-source, in process (a subprocess would add its start-up)."""
    from fairseq import options
    from fairseq_cli import preprocess

    argv = ["--only-source", "--destdir", str(dest), "--workers", "1"]
    for split in splits:  # train, valid or test
        argv += [f"--{split}pref", str(text_dir / f"{split}.txt")]
    preprocess.main(options.get_preprocessing_parser().parse_args(argv))
    return dest


# the model sizes of the small command lines (fairseq-train options)
TINY_SIZES = ("--num-layers", "2", "--hidden-size", "64", "--num-heads", "4", "--ffn-size", "128",
              "--embedding-size", "32")


def train_cmd(data: Path, save_dir: Path, *extra: str, arch: str = "electra_tiny"):
    """A small fairseq-train command line for the electra task on CPU."""
    return [
        sys.executable, "-m", "fairseq_cli.train", str(data), "--user-dir", PLUGIN,
        "--task", "electra", "--criterion", "electra", "--arch", arch, "--cpu",
        "--tokens-per-sample", "32", "--batch-size", "8", "--num-workers", "0",
        *TINY_SIZES,
        "--optimizer", "adam", "--lr", "5e-4", "--lr-scheduler", "polynomial_decay",
        "--warmup-updates", "2", "--total-num-update", "100", "--save-dir", str(save_dir),
        "--log-format", "json", "--log-interval", "1", "--no-progress-bar", "--seed", "3",
        "--data-buffer-size", "0",  # fairseq's prefetch thread can abort the exit (docs/long_runs.md)
        *extra,
    ]


def built_from_command_line(data: Path, *extra: str, cpu: bool = True):
    """-> (the whole config fairseq-train builds from a small electra command line, its
    task, its model), in process (``cpu=False``: a GPU run's command line; nothing is run)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = [str(data), "--user-dir", PLUGIN, "--task", "electra", "--criterion", "electra",
            "--arch", "electra_tiny", *(["--cpu"] if cpu else []), "--tokens-per-sample", "32",
            "--batch-size", "8", "--optimizer", "electra_adam", "--weight-decay", "0.01", *extra]
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_training_parser(), argv))
    task = tasks.setup_task(cfg.task)
    return cfg, task, task.build_model(cfg.model)


def composed(config_dir: Path, name: str, *overrides: str):
    """-> the config fairseq-hydra-train builds from ``--config-dir config_dir --config-name
    name overrides``, in process: hydra's composition with fairseq's schema registered under
    the config's name (fairseq's hydra_init), then fairseq's defaults, resolved. A new copy
    per call; each composition (about a second) is made once per process, the recipes being
    files no test changes."""
    return OmegaConf.create(_composed(str(config_dir), name, overrides))


@functools.cache
def _composed(config_dir: str, name: str, overrides: tuple) -> dict:
    from fairseq.dataclass.initialize import add_defaults, hydra_init
    from fairseq.utils import import_user_module
    from hydra import compose, initialize_config_dir

    import_user_module(OmegaConf.create({"user_dir": PLUGIN}))  # as common.user_dir does
    hydra_init(name)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.1"):
        cfg = compose(config_name=name, overrides=list(overrides))
    add_defaults(cfg)
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


class CreatesAFile:
    """Unpickled, this creates ``marker``: what a tampered checkpoint could do instead. The
    kinds of object a pickle can name to do it: a method of an importable class (``touch``),
    a builtin function (``open``), a function of a module torch's safe loader blocks outright
    (``os.makedirs``), a class whose construction writes (``logging.FileHandler``)."""

    KINDS = ("method", "builtin", "blocked module", "class")

    def __init__(self, marker, kind="method"):
        self.marker, self.kind = marker, kind

    def __reduce__(self):
        import logging

        marker = str(self.marker)
        return {"method": (Path.touch, (Path(marker),)), "builtin": (open, (marker, "w")),
                "blocked module": (os.makedirs, (marker,)),
                "class": (logging.FileHandler, (marker,))}[self.kind]


def command(module, *args):
    """The command line of one of the plugin's commands (electra_plugin.cli.MODULE)."""
    return [sys.executable, "-m", f"electra_plugin.cli.{module}", *args]


def assert_one_line_error(proc, *phrases) -> str:
    """A failed command whose stderr ends in one plugin error line holding ``phrases``."""
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("electra_plugin: error: "), proc.stderr[-2000:]
    for phrase in phrases:
        assert phrase in last, last
    return last


def run_here(cmd) -> subprocess.CompletedProcess:
    """A fairseq-train command line run by :func:`train_in_process` and reported as :func:`run`
    reports the command: fairseq's log lines (what fairseq-train prints on stdout) as stdout;
    on an exception, status 1 and the traceback as stderr. It spares a run the interpreter's
    start-up and imports (about 5 of a tiny run's 6 seconds); a test of the command line
    itself (its exit, its stderr, signals, several processes) runs it with :func:`run`."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s"))
    root = logging.getLogger()
    level, threads = root.level, torch.get_num_threads()
    torch.set_num_threads(1)  # as run gives its commands (OMP_NUM_THREADS=1)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    # what a new process starts without: fairseq keeps the best score so far on the function
    vars(checkpoint_utils.save_checkpoint).pop("best", None)
    code, error = 0, ""
    try:
        train_in_process(cmd)
    except Exception:  # noqa: BLE001 - reported as a failed command is
        code, error = 1, traceback.format_exc()
    finally:
        release_save_dirs()  # as the command's exit does: a later command may use the dir
        root.removeHandler(handler)
        root.setLevel(level)
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(cmd, code, stream.getvalue(), error)


def train_in_process(cmd) -> None:
    """A ``train_cmd`` (fairseq-train, or electra-train when the module is swapped in) run by
    the same main in this process, as a Python caller runs it (not through the command
    line's ``call_main``): the run without an interpreter's start-up, and an
    ElectraUsageError it raises reaches the caller as the exception."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train

    from electra_plugin.cli import train as train_cli

    argv = [str(c) for c in cmd[3:]]
    args = train_cli.parse_args(argv) if cmd[2] == "electra_plugin.cli.train" else \
        options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    train.main(convert_namespace_to_omegaconf(args))


def usage_error_in(error: BaseException) -> ElectraUsageError:
    """The ElectraUsageError that ``error`` is or was raised from: fairseq's trainer wraps
    one raised while it loads a checkpoint (``raise Exception("Cannot load model parameters
    ...")`` in an ``except``), so there it is the wrapper's ``__context__``."""
    found = usage_error_in_chain(error)
    if found is None:
        pytest.fail(f"no ElectraUsageError in the chain of {type(error).__name__}: {error}")
    return found


def assert_usage_line(error: BaseException, *phrases) -> str:
    """``error`` is (or wraps) an ElectraUsageError of one line holding ``phrases``."""
    line = str(usage_error_in(error))
    assert line.startswith("electra_plugin: error: ") and "\n" not in line, line
    for phrase in phrases:
        assert phrase in line, line
    return line


def assert_usage_error(cmd, *phrases) -> str:
    """``train_in_process(cmd)`` stops with one ElectraUsageError line holding ``phrases``
    (itself, or the error fairseq's trainer wrapped it in)."""
    with pytest.raises(Exception) as caught:
        train_in_process(cmd)
    return assert_usage_line(caught.value, *phrases)


def assert_main_error(main, argv, *phrases) -> str:
    """One of our commands' ``main(argv)``, in process, stops with one ElectraUsageError line
    holding ``phrases`` (the console script's edge, errors.command_line, turns it into the
    line on stderr and exit status 1: test_errors runs that once as a real command)."""
    with pytest.raises(ElectraUsageError) as caught:
        main([str(a) for a in argv])
    return assert_usage_line(caught.value, *phrases)


def start(cmd, env=None, cwd=None, fresh=False, merge_stderr=False, file_modes=False,
          limits=None, **popen):
    """``cmd`` started, its output captured as text: a ``python -m MODULE`` or ``python -c
    CODE`` command forked by the fork server (:mod:`forkserver`), unless ``fresh`` or Popen's
    own options (``start_new_session``) ask for a new interpreter; ``env``: variables added to
    this environment; ``merge_stderr``: stderr into stdout; ``file_modes``: as root, without
    the power to write where file modes say no (a fresh command under ``setpriv``);
    ``limits``: {resource: limit} set on the command (its output stays out of them)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}))
    cmd = [str(c) for c in cmd]
    for check in BEFORE_START:
        check(cmd)
    limits = dict(limits or {})
    if forkable(cmd, env, cwd) and not fresh and not popen:
        return ForkedProcess(cmd, env=env, cwd=cwd, merge_stderr=merge_stderr,
                             file_modes=file_modes and os.geteuid() == 0,
                             limits=limits.items())
    if file_modes and os.geteuid() == 0:
        cmd = ["setpriv", "--bounding-set=-dac_override", *cmd]
    if limits:
        popen["preexec_fn"] = functools.partial(set_limits, limits.items())
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                            **popen)


BEFORE_START = []  # checks of a command line before it starts (conftest's fast-tier guard)


def run(cmd, env=None, cwd=None, fresh=False, timeout=600,
        **options) -> subprocess.CompletedProcess:
    """``cmd`` to its end (:func:`start`), as subprocess.run reports it."""
    proc = start(cmd, env=env, cwd=cwd, fresh=fresh, **options)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# ------------------------------------ fairseq-train / hydra runs and their logs

CONFIG_DIR = REPO / "examples" / "pretraining" / "config"
DISC_WEIGHT = 50.0  # the criterion's default (official lambda)


def train(data, save_dir, *extra):
    """Run a small fairseq-train (:func:`train_cmd`) in this process; return its log."""
    result = run_here(train_cmd(data, save_dir, *extra))
    assert result.returncode == 0, failure("fairseq-train", result)
    return result.stdout


TIMING = {"wps", "ups", "wall", "train_wall"}  # differ between any two runs


def assert_metrics_equal(a, b, what):
    """Two lists of logged records agree up to the logged rounding (timings aside)."""
    assert len(a) == len(b) > 0, f"{what}: {len(a)} vs {len(b)} log lines"
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for key in ra.keys() - TIMING:
            assert abs(ra[key] - rb[key]) <= 0.011 + 1e-4 * abs(ra[key]), \
                f"{what}: {key} {ra[key]} vs {rb[key]} at update {ra['num_updates']:g}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_options(rank, workers, port):
    """One rank's fairseq-train options of a CPU job (gloo, legacy_ddp) on this machine."""
    return ("--distributed-world-size", str(workers), "--distributed-rank", str(rank),
            "--distributed-no-spawn", "--distributed-backend", "gloo", "--ddp-backend",
            "legacy_ddp", "--distributed-init-method", f"tcp://127.0.0.1:{port}")


def run_together(cmds, timeout=300):
    """Commands started at once (the ranks or the nodes of one job) -> each one's
    (exit status, stdout, stderr)."""
    procs = [start(cmd) for cmd in cmds]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]


def ddp_train(data, save_dir, *extra, workers=2):
    """fairseq-train on ``workers`` CPU processes (gloo, legacy_ddp) -> each rank's
    (stdout, stderr); fails the test when a rank fails."""
    port = free_port()
    results = run_together([train_cmd(data, save_dir, *extra, *ddp_options(rank, workers, port))
                            for rank in range(workers)])
    failed = [f"rank {rank} exited {code}\n{out[-2000:]}\n{err[-3000:]}"
              for rank, (code, out, err) in enumerate(results) if code]
    assert not failed, "\n".join(failed)
    return [(out, err) for _, out, err in results]


def hydra_cmd(config_name, data, save_dir, run_dir, *overrides, cpu=True):
    """fairseq-hydra-train on a pre-training yaml, shrunk to a few small batches."""
    return [
        sys.executable, "-m", "fairseq_cli.hydra_train",
        "--config-dir", str(CONFIG_DIR), "--config-name", config_name,
        f"task.data={data}", f"common.user_dir={PLUGIN}", f"common.cpu={str(cpu).lower()}",
        "common.log_format=json", "common.log_interval=1",
        "task.tokens_per_sample=32", "dataset.batch_size=4", "task.global_batch_size=4",
        "dataset.num_workers=0",
        "dataset.data_buffer_size=0", "dataset.disable_validation=true",
        f"checkpoint.save_dir={save_dir}", f"hydra.run.dir={run_dir}", *overrides,
    ]


def hydra_train(tmp, data, *overrides, config_name="electra_small", cpu=True):
    """fairseq-hydra-train from a scratch cwd (hydra changes directory) -> (stdout, save_dir)."""
    save_dir, cwd = tmp / "checkpoints", tmp / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    result = run(hydra_cmd(config_name, data, save_dir, tmp / "hydra", *overrides, cpu=cpu),
                 cwd=cwd)
    assert result.returncode == 0, failure("fairseq-hydra-train", result)
    return result.stdout, save_dir


def failure(what, result):
    return f"{what} exited {result.returncode}\n--- stdout\n{result.stdout[-3000:]}\n" \
           f"--- stderr\n{result.stderr[-3000:]}"


def records(stdout, tag="train_inner"):
    """The json metrics of every ``tag`` log line, values as floats (a meter restored from a
    mid-epoch checkpoint and not updated since, fairseq's ``null``, left out).

    fairseq-train writes ``... | INFO | train_inner | {...}``, fairseq-hydra-train
    ``[...][train_inner][INFO] - {...}``.
    """
    out = []
    for line in stdout.splitlines():
        if (f"| {tag} |" in line or f"[{tag}]" in line) and "{" in line:
            raw = json.loads(line[line.index("{"):])
            out.append({k: float(v) for k, v in raw.items() if v is not None})
    return out


def checkpoint(path):
    assert path.is_file(), f"{path} was not written"
    return torch.load(path, map_location="cpu", weights_only=False)


def assert_same_params(a, b, atol, what):
    assert a.keys() == b.keys(), f"{what}: different parameter names"
    worst = max(a, key=lambda k: (a[k].float() - b[k].float()).abs().max().item())
    diff = (a[worst].float() - b[worst].float()).abs().max().item()
    assert diff <= atol, f"{what}: {worst} differs by {diff:g} (atol {atol:g})"


def import_plugin():
    """Register the plugin in this process the way fairseq's --user-dir does."""
    from fairseq.utils import import_user_module

    import_user_module(argparse.Namespace(user_dir=PLUGIN))


def train_from_model_cfg(data, save_dir, model_cfg, *extra):
    """One fairseq-train update of an electra model built from ``model_cfg`` (an
    imported checkpoint's options)."""
    return run_here([sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN,
                     "--task", "electra", "--criterion", "electra", *model_cli_args(model_cfg),
                     "--cpu", "--tokens-per-sample", "32", "--batch-size", "4",
                     "--num-workers", "0", "--optimizer", "adam", "--lr", "1e-4",
                     "--max-update", "1", "--save-dir", save_dir, "--no-epoch-checkpoints",
                     "--disable-validation", "--log-format", "json", "--log-interval", "1",
                     "--no-progress-bar", *extra])


def assert_one_update_from(proc, save_dir, imported):
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Loaded checkpoint" in proc.stderr + proc.stdout
    after = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu")
    assert after["optimizer_history"][-1]["num_updates"] == 1
    before = torch.load(imported, map_location="cpu")["model"]
    # one Adam step of lr 1e-4 moves each weight by about 1e-4: the run started from ours
    for key, value in before.items():
        assert (after["model"][key] - value).abs().max() < 1e-3, key


# ------------------------------------------------------------------------ files

def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------ tiny models and batches

def make_task(vocab_size=60, tokens_per_sample=32):
    d = Dictionary()
    for i in range(vocab_size - len(d) - 1):
        d.add_symbol(f"w{i}")
    return ElectraPretrainingTask(
        ElectraPretrainingConfig(data="unused", tokens_per_sample=tokens_per_sample, seed=1), d)


def tiny_model_config(**overrides):
    return OmegaConf.create(dict(dict(_name="electra_tiny", num_layers=2, hidden_size=64,
                                      num_heads=4, ffn_size=128, embedding_size=32),
                                 **overrides))


def tiny_model(task=None, **overrides):
    task = task or make_task()
    torch.manual_seed(0)
    return ElectraModel.build_model(tiny_model_config(**overrides), task), task


def masked_batch(task, rows=3, length=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = task.dictionary
    tokens = torch.randint(d.nspecial, len(d) - 1, (rows, length), generator=g)
    tokens[:, 0] = d.bos()
    tokens[:, -1] = d.eos()
    tokens[-1, -5:] = d.pad()  # a padded row
    picked = (torch.rand(rows, length, generator=g) < 0.3) & (tokens >= d.nspecial)
    picked[:, 1] = True
    src = tokens.masked_fill(picked, task.mask_idx)
    target = tokens.masked_fill(~picked, d.pad())
    return src, target, tokens, picked


def sample_for(task, seed=0):
    src, target, _, _ = masked_batch(task, seed=seed)
    return {"net_input": {"src_tokens": src, "src_lengths": src.ne(1).sum(1)},
            "target": target, "ntokens": int(src.ne(1).sum()), "nsentences": len(src)}


# ------------------------------------------------------------------- optimizers

def adam_cfg(name):
    cfg = {"_name": name, "lr": [1e-3], "adam_betas": "(0.9, 0.999)", "adam_eps": 1e-6,
           "weight_decay": 0.01, "tpu": False, "use_old_adam": False, "fp16_adam_stats": False}
    if name == "electra_adam":
        cfg["layer_decay"] = 1.0
    return OmegaConf.create(cfg)


def electra_adam_cfg(**fields):
    cfg = ElectraAdamConfig(lr=[1e-3], tpu=False, adam_betas="(0.9, 0.999)", adam_eps=1e-8,
                            **fields)
    return OmegaConf.merge(OmegaConf.structured(cfg), {"_name": "electra_adam"})


def amp_optimizer(name, params, scale):
    """fairseq's AMPOptimizer over ``name``; off CUDA with a CPU GradScaler at ``scale`` (the
    CUDA one it builds switches itself off without a GPU)."""
    cfg = OmegaConf.create({"optimizer": adam_cfg(name),
                            "common": {"fp16_init_scale": scale, "amp_scale_window": None,
                                       "min_loss_scale": 1e-4}})
    optimizer = AMPOptimizer.build_optimizer(cfg, params)
    if not params[0].is_cuda:
        optimizer._grad_scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    return optimizer


def one_update(model, task, optimizer, step, amp):
    """A training update in the trainer's order: backward, clip (fairseq always calls it;
    0 = norm only), the task's optimizer_step."""
    src, target, _, _ = (t.to(next(model.parameters()).device) for t in masked_batch(task))
    torch.manual_seed(1)  # the same generator samples in every copy
    out = model(src, target=target)
    loss = out.generator_loss + DISC_WEIGHT * out.main_loss
    optimizer.backward(loss) if amp else loss.backward()
    optimizer.clip_grad_norm(0.0)
    step(optimizer)


# ------------------------------------------------------------------------- GLUE

GLUE = [sys.executable, "-m", "electra_plugin.cli.glue"]  # electra-glue, installed or not


def sentence(rng):
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ."


def write_rte(root, n_train=96, n_dev=40, seed=0):
    """Label = entailment when the hypothesis repeats the premise's subject."""
    rng = random.Random(seed)
    root.mkdir(parents=True)
    for split, n in (("train", n_train), ("dev", n_dev)):
        rows = ["index\tsentence1\tsentence2\tlabel"]
        for i in range(n):
            premise = sentence(rng)
            subject = " ".join(premise.split()[:2])
            same = rng.random() < 0.5
            other = subject if same else rng.choice([s for s in SUBJECTS if s != subject])
            label = "entailment" if same else "not_entailment"
            rows.append(f"{i}\t{premise}\t{other} {rng.choice(VERBS)} it .\t{label}")
        (root / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return root


def preprocess(task, glue_dir, spm_data, dest, *extra):
    return run([*GLUE, "preprocess", "--task", task, "--glue-dir",
                glue_dir, "--pretrain-data", spm_data, "--destdir", dest, *extra])


# ------------------------------------------------------------------------ SQuAD

# Contexts made of the pre-training corpus' words (SUBJECTS, VERBS, ... above), plus capitals and
# digits the 80-piece sentencepiece model has never seen (they become <unk> pieces).
SHORT = "the cat sees a house in the park . a dog likes the ball ."
_rng = random.Random(7)
_FILLER = " ".join(
    f"{_rng.choice(['the cat', 'a dog', 'my neighbour', 'the river'])} "
    f"{_rng.choice(['likes', 'builds', 'follows'])} "
    f"{_rng.choice(['an apple', 'the letter', 'a warm coat'])} ." for _ in range(12))
LONG = ("the teacher carries two boxes every winter . " + _FILLER
        + " Mr. Brown watches the morning news near the station in 1999 . the end .")


def answer(text, context, occurrence=0):
    start = -1
    for _ in range(occurrence + 1):
        start = context.index(text, start + 1)
    return {"text": text, "answer_start": start}


def squad_json(version="2.0"):
    """Five questions: a short context, a long one needing several windows with answers at
    both ends, several gold answers, and (2.0) an unanswerable question."""
    qas_short = [{"id": "q1", "question": "what does the cat see ?",
                  "answers": [answer("a house", SHORT)]}]
    qas_long = [
        {"id": "q2", "question": "who watches the morning news ?",
         "answers": [answer("Mr. Brown", LONG)]},
        {"id": "q3", "question": "what does the teacher carry ?",
         "answers": [answer("two boxes", LONG)]},
        {"id": "q5", "question": "where does he watch the news ?",
         "answers": [answer("near the station", LONG), answer("the station", LONG)]},
    ]
    if version == "2.0":
        qas_short.append({"id": "q4", "question": "what does the river build ?",
                          "answers": [], "is_impossible": True,
                          "plausible_answers": [answer("a house", SHORT)]})
        for qa in qas_short + qas_long:
            qa.setdefault("is_impossible", False)
    return {"version": version, "data": [{"title": "t", "paragraphs": [
        {"context": SHORT, "qas": qas_short}, {"context": LONG, "qas": qas_long}]}]}


def write_json(path, obj):
    path.write_text(json.dumps(obj))
    return path


# ------------------------------------------------------------- tokenizer inputs

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Text for the tokenizer comparison: accents, punctuation, CJK, emoji, controls, odd spaces,
# Greek capitals (sigma), literal special tokens, over-long words.
VARIED = [
    "The quick brown fox jumps over the lazy dog.",
    "Café déjà vu: naïve coöperation at the Hôtel Ångström, façade & résumé!",
    "ΟΔΟΣ ΣΟΦΟΣ; Привет, МИР! İstanbul, straße, Ærø, Œuvre.",
    "北京欢迎你！日本語のテキスト、한국어 텍스트 and English mixed.",
    "Emoji 😀👍🏽 👨‍👩‍👧 🇺🇸 ❤️ 🫠 ☕️ ™ © ½ ² µ.",
    "Ctrl\x00nul\x01soh\x7fdel zero\u200bwidth soft\u00adhyphen bom\ufeff repl\ufffd.",
    "Spaces:\u00a0nbsp\u2003em\u3000ideo\u2028ls\ttab\x0bvt\x85nel end",
    "Specials [CLS] hello [SEP] world[MASK]x [UNK] [PAD][sep] [ CLS ]",
    "e\u0301 decomposed, \u0301 alone, ﬁ ligature, ｆｕｌｌ！ and `varia` \u1fef.",
    "Rare: \U0002B820\U0002B8FF ext-E, \u0378unassigned, 🫨 newer emoji.",
    "U.S.A. e-mail @user #tag http://example.com/a?b=c&d=e 3.14 1,000,000 50% $5 {x} <y> \\z",
    "—–…“quoted” ‘single’ «guillemets» ¿qué? ¡sí! § ¶ † • € £ ¥",
    "x" * 100 + " " + "y" * 101 + " " + "supercalifragilistic" * 3,
    "",
    "   \t  ",
]


def words_of(text, lowercase):
    """BERT's words and punctuation before WordPiece (special-token strings not kept)."""
    normalized = BertNormalizer(lowercase=lowercase).normalize_str(text)
    return [word for word, _ in BertPreTokenizer().pre_tokenize_str(normalized)]


def vocab_for(texts, lowercase, rng):
    """A BERT-style vocab.txt for `texts`: every character, most of them also as '##' pieces,
    some whole words and prefixes; a few characters are left out so [UNK] happens."""
    words = sorted({w for t in texts for w in words_of(t, lowercase)})
    chars = sorted({c for w in words for c in w})
    missing = set(rng.sample(chars, 4))
    vocab = list(SPECIALS) + [f"[unused{i}]" for i in range(3)]
    vocab += [c for c in chars if c not in missing]
    vocab += ["##" + c for c in chars if c not in missing and rng.random() < 0.85]
    for w in words:
        if len(w) > 3 and rng.random() < 0.5:
            vocab.append(w)
        if len(w) > 5:
            vocab += [w[:3], "##" + w[3:5]]
    return list(dict.fromkeys(vocab))


def python_docs_paragraphs(n):
    """Real English text with code, quotes and odd punctuation: Python's own help topics."""
    from pydoc_data.topics import topics

    paragraphs = [p for key in sorted(topics) for p in topics[key].split("\n\n") if p.strip()]
    return paragraphs[:: max(1, len(paragraphs) // n)][:n]


# ------------------------------------------------------- one task of every fine-tuning kind

NER = "the DT O\ncat NN B-ANI\nsees VB O\na DT O\ndog NN B-ANI\n\nmy PR O\nneighbour NN B-PER\n"


def sentence_task_rows(rng=None, **counts) -> dict:
    """{split: a binary sentence task's .tsv text (text, label pos/neg)} with ``counts``
    rows per split (``train=40, dev=16``), drawn from ``rng`` (default: seeded 0)."""
    rng = rng or random.Random(0)
    return {split: "\n".join(["text\tlabel"] + [f"{sentence(rng)}\t{rng.choice(['pos', 'neg'])}"
                                               for _ in range(n)]) + "\n"
            for split, n in counts.items()}


def gpu_session_data(root, spm_data, tasks):
    """benchmarks/gpu_session.sh's DATA folder: data-bin (``spm_data``) and TASK-bin of each
    of ``tasks``, a binary sentence task made by electra-glue preprocess."""
    from electra_plugin.cli import glue as glue_cli

    data = root / "data"
    data.mkdir()
    (data / "data-bin").symlink_to(spm_data)
    for seed, task in enumerate(tasks):
        raw = root / task
        raw.mkdir()
        for split, rows in sentence_task_rows(random.Random(seed), train=40, dev=16).items():
            (raw / f"{split}.tsv").write_text(rows)
        glue_cli.main(["preprocess", "--task", task, "--text-columns", "0", "--glue-dir",
                       str(raw), "--pretrain-data", str(spm_data), "--out-dir",
                       str(data / f"{task}-bin")])
    return data


def prepared_suite(root, spm_data):
    """A binary sentence task of one's own, NER, SQuAD 1.1 and multiple choice, each made by
    its preparation command; -> the suite file naming them."""
    from electra_plugin.cli import choice as choice_cli
    from electra_plugin.cli import glue as glue_cli
    from electra_plugin.cli import squad as squad_cli
    from electra_plugin.cli import tag as tag_cli

    rng = random.Random(0)
    own = root / "own"
    own.mkdir()
    for split, rows in sentence_task_rows(rng, train=40, dev=16).items():
        (own / f"{split}.tsv").write_text(rows)
    glue_cli.main(["preprocess", "--task", "opinions", "--text-columns", "0", "--glue-dir",
                   str(own), "--pretrain-data", str(spm_data), "--out-dir", str(root / "own-bin")])
    (root / "ner.conll").write_text((NER + "\n") * 6)
    (root / "ner-test.conll").write_text("a O\ndog O\n\nmy O\ncat O\n")
    tag_cli.main(["preprocess", "--pretrain-data", str(spm_data), "--train",
                  str(root / "ner.conll"), "--valid", str(root / "ner.conll"), "--test",
                  str(root / "ner-test.conll"), "--out-dir", str(root / "ner-bin")])
    squad = write_json(root / "squad.json", squad_json("1.1"))
    squad_cli.main(["preprocess", "--pretrain-data", str(spm_data), "--train", str(squad),
                    "--valid", str(squad), "--test", str(squad), "--out-dir",
                    str(root / "squad-bin"),
                    "--max-seq-len", "64", "--doc-stride", "16", "--max-query-len", "16"])
    (root / "mc.jsonl").write_text("".join(json.dumps(
        {"context": sentence(rng), "choices": [sentence(rng), sentence(rng)],
         "label": rng.randrange(2)}) + "\n" for _ in range(12)))
    choice_cli.main(["preprocess", "--pretrain-data", str(spm_data), "--train",
                     str(root / "mc.jsonl"), "--valid", str(root / "mc.jsonl"), "--test",
                     str(root / "mc.jsonl"), "--out-dir", str(root / "mc-bin")])
    (root / "suite.yaml").write_text(
        "tasks:\n  opinions: own-bin\n  ner:\n    data: ner-bin\n    batch_size: 4\n"
        "  squad: squad-bin\n  choice: mc-bin\n")
    return root / "suite.yaml"


def small_modern_encoder(window: int):
    """A 4-layer ModernBERT-body encoder (width 32, 2 heads, every third layer global, local
    layers of ``window`` tokens, no dropout) over a 50-entry vocabulary, seeded."""
    from omegaconf import OmegaConf

    from electra_plugin.models.bodies import body_named
    from electra_plugin.models.core.config import EncoderSize

    cfg = OmegaConf.create(dict(embedding_size=32, dropout=0.0, attention_dropout=0.0,
                                global_attn_every_n_layers=3, local_attention=window,
                                global_rope_theta=160000.0, local_rope_theta=10000.0))
    body = body_named("modern")(cfg, 50, 1)
    torch.manual_seed(0)
    return body.encoder(body.embeddings(), EncoderSize(4, 32, 2, 64, 32))
