"""Shared fixtures (a tiny English-like corpus binarized with fairseq-preprocess, a short
pre-training run) and the fast tier's rule: a test not marked slow spawns no
electra-prepare, fairseq-preprocess or fairseq-(hydra-)train."""

import collections
import compileall
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from electra_plugin.cli import prepare
from forkserver import freeze_libraries
from helpers import BEFORE_START, PLUGIN, binarize, run_here, write_corpus

# The commands only a slow test may start: console scripts and their ``-m`` modules.
SLOW_COMMANDS = {"electra-prepare", "electra_plugin.cli.prepare", "fairseq-preprocess",
                 "fairseq_cli.preprocess", "fairseq-train", "fairseq_cli.train",
                 "fairseq-hydra-train", "fairseq_cli.hydra_train", "electra-train",
                 "electra_plugin.cli.train"}
_current = {"item": None}  # the test being set up, run or torn down


def pytest_configure(config):
    """Under pytest-xdist each worker gets its share of the cores for in-process torch (the
    subprocesses a test starts run on one thread: helpers.run). A graphed step that falls
    back to the eager one is an error throughout (the runs the tests start inherit it)."""
    os.environ.setdefault("ELECTRA_GRAPHED_STRICT", "1")
    compile_bytecode()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def compile_bytecode():
    """The repository's Python compiled to bytecode beside it (``__pycache__``, ignored by
    git), as Python does where PYTHONDONTWRITEBYTECODE is unset, and the test processes
    writing theirs (pytest's rewritten test modules): the few hundred commands the tests
    start import the plugin's sources, and each would compile them anew (0.08 of a tiny
    run's 0.7 CPU seconds), as would each worker its tests (docs/testing.md). Where the
    folders cannot be written, everything compiles in memory as before."""
    sys.dont_write_bytecode = False
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the process that started it compiled them
        return
    for folder in ("electra_plugin", "benchmarks", "scripts", "tests"):
        compileall.compile_dir(Path(__file__).parents[1] / folder, quiet=2, workers=1)


# Seconds each of the longest files takes in a full run (--durations, summed; docs/testing.md;
# test_graphed_checks.py as in a fresh clone, whose inductor cache is empty), handed out
# longest first, then the rest by their number of tests: pytest.ini turns off xdist's own
# order (most tests first), which left a long file to run alone at the end while the other
# worker sat idle.
FILE_SECONDS = {"test_compile.py": 97, "test_gpu_session.py": 68, "test_graphed_checks.py": 45,
                "test_forkserver.py": 32, "test_trials.py": 30, "test_kinds.py": 28,
                "test_compile_time.py": 24, "test_bodies.py": 23, "test_benchmark.py": 22,
                "test_new_language.py": 21, "test_training.py": 20, "test_installed.py": 19,
                "test_layers_traced_once.py": 18, "test_whole_update.py": 17.5,
                "test_scale_out.py": 17, "test_crash_safety.py": 16, "test_readme.py": 15,
                "test_padded_vocab.py": 14, "test_errors.py": 13, "test_full_disk.py": 12,
                "test_modern_graphed.py": 11, "test_glue.py": 10, "test_fast_path.py": 9}


def pytest_collection_modifyitems(items):
    """Files by FILE_SECONDS, longest first, then the rest by their number of tests."""
    counts = collections.Counter(item.path.name for item in items)

    def rank(item):
        name = item.path.name
        return -FILE_SECONDS.get(name, 0), -counts[name], name

    items.sort(key=rank)  # stable: a file's tests keep their order


def pytest_collection_finish(session):
    """The libraries and the collected tests frozen for the collector
    (:func:`forkserver.freeze_libraries`; the fast tier on one worker: 100 -> 72 s)."""
    freeze_libraries()


def pytest_addoption(parser):
    parser.addoption("--core-seconds", metavar="FILE",
                     help="append each test's busy core-seconds (/proc/stat: the test and "
                     "every process it starts; meaningful with -n0) and wall seconds to FILE, "
                     "one JSON line a test (docs/testing.md, 'Where the time goes')")


def busy_core_seconds() -> float:
    """The machine's busy CPU time so far (/proc/stat: user, nice, system, irq, softirq)."""
    with open("/proc/stat") as stat:
        ticks = stat.readline().split()[1:]
    return sum(int(ticks[i]) for i in (0, 1, 2, 5, 6)) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    _current["item"] = item
    record = item.config.getoption("core_seconds")
    busy, start = (busy_core_seconds(), time.monotonic()) if record else (0, 0)
    yield
    _current["item"] = None
    if record:
        with open(record, "a") as out:
            out.write(json.dumps({"test": item.nodeid, "wall": time.monotonic() - start,
                                  "core_seconds": busy_core_seconds() - busy}) + "\n")


def _slow_command(args):
    argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
    return next((a for a in argv if Path(a).name in SLOW_COMMANDS or a in SLOW_COMMANDS), None)


_popen_init = subprocess.Popen.__init__


def _refuse_slow_command(args):
    """Fail a fast test (its fixtures included) that starts one of SLOW_COMMANDS: the fast
    tier stays fast because nothing in it trains or preprocesses in a subprocess."""
    item, command = _current["item"], _slow_command(args)
    if item is not None and command and item.get_closest_marker("slow") is None:
        raise AssertionError(f"{item.nodeid} is not marked slow but runs {command}: mark it "
                             f"@pytest.mark.slow or do the work in process")


def _checked_popen_init(self, args, *rest, **kwargs):
    _refuse_slow_command(args)
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _checked_popen_init
BEFORE_START.append(_refuse_slow_command)  # the commands the fork server starts


@pytest.fixture(scope="session")
def data_bin(tmp_path_factory) -> Path:
    """train (1200 sentences) and valid (80) binarized; dict.txt without <mask>."""
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root / "train.txt", 1200, seed=0)
    write_corpus(root / "valid.txt", 80, seed=1)
    return binarize(root, root / "bin")


@pytest.fixture(scope="session")
def spm_data(tmp_path_factory) -> Path:
    """The tiny corpus through electra-prepare (sentencepiece, 80 pieces: no room for byte
    fallback's 256, so without it, as electra-prepare trained every model before)."""
    root = tmp_path_factory.mktemp("spm")
    write_corpus(root / "corpus.txt", 1500, seed=5)
    prepare.main(["--train", str(root / "corpus.txt"), "--destdir", str(root / "bin"),
                  "--sentencepiece-vocab-size", "80", "--no-byte-fallback",
                  "--workers", "1"])  # in process
    return root / "bin"


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory, spm_data) -> Path:
    """A 6-update electra_tiny pre-training checkpoint on spm_data."""
    save = tmp_path_factory.mktemp("pretrained")
    proc = run_here([sys.executable, "-m", "fairseq_cli.train", spm_data, "--user-dir", PLUGIN,
                     "--task", "electra", "--criterion", "electra", "--arch", "electra_tiny",
                     "--cpu", "--tokens-per-sample", "64", "--batch-size", "8",
                     "--num-workers", "0", "--optimizer", "electra_adam", "--lr", "5e-4",
                     "--max-update", "6", "--save-dir", save, "--no-epoch-checkpoints",
                     "--disable-validation", "--seed", "1", "--data-buffer-size", "0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return save / "checkpoint_last.pt"
