"""fairseq-train runs started warm: ``electra-finetune trials`` starts each trial, and
scripts/electra_vs_mlm.py each pre-training arm (fairseq-hydra-train), from the standard
library's fork server, which has imported torch and fairseq once, instead of a new
interpreter that imports them again (about 4 of a small trial's seconds on a CPU). A run is
still a process of its own, with its log, environment, threads and exit status, and the
command's logging; the command printed is the one it runs. Its collector skips what the
server imported (``gc.freeze``). ``ELECTRA_SPEED=0`` (or ``-launch``) starts that command as
a new interpreter instead."""

import contextlib
import gc
import importlib
import logging
import multiprocessing
import os
import subprocess
import sys
import types

from .switch import enabled

# what fairseq-train imports, without fairseq_cli.train itself (it sets up logging);
# torch._dynamo: torch's optimizers import it when the first is built (about 0.7 s)
PRELOADED = ["torch", "torch._dynamo", "fairseq.checkpoint_utils", "fairseq.options",
             "fairseq.tasks", "fairseq.trainer"]


class ForkedRun:
    """A forked run as its callers use a Popen: poll, returncode, terminate, kill, wait."""

    def __init__(self, process):
        self.process = process

    def poll(self):
        return self.process.exitcode

    @property
    def returncode(self):
        return self.process.exitcode

    def terminate(self):
        self.process.terminate()

    def kill(self):
        self.process.kill()

    def wait(self, timeout=None):
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired("fairseq-train", timeout)
        return self.process.exitcode


def start_fairseq_train(cmd, log, env):
    """Start ``cmd`` (``python -m fairseq_cli.train ARGS``, or ``fairseq_cli.hydra_train``:
    a module with a ``cli_main``) with stdout and stderr into the open file ``log`` and the
    environment ``env``: forked warm where the platform has a fork server, else as the
    command itself."""
    if not enabled("launch") or "forkserver" not in multiprocessing.get_all_start_methods():
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    process = context.Process(target=fairseq_train, args=(cmd[2], cmd[3:], log.name, env))
    with main_module_hidden():
        process.start()
    return ForkedRun(process)


@contextlib.contextmanager
def main_module_hidden():
    """multiprocessing runs the caller's ``__main__`` script again in each child, so that
    names defined there unpickle. A trial needs none of them, and a caller's script without
    an ``if __name__ == "__main__"`` guard would start its trials again in every trial."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def fairseq_train(module: str, argv, log_path: str, env) -> None:
    """The forked process: ``module``'s ``cli_main`` on ``argv``, as its command runs it."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    os.environ.clear()
    os.environ.update(env)
    # a process the fork server starts defaults to starting its own children from a fork
    # server too: the run's loader workers would then start as new interpreters that import
    # fairseq again, each epoch (6.8 s an epoch on an H200 machine); a new interpreter's
    # default (fork on Linux) starts them as fairseq-train does
    multiprocessing.set_start_method(None, force=True)
    # the server's imports are never garbage: the run's collector skips them (a tiny
    # fairseq-train run's CPU time: about 0.25 of 1.4 s)
    gc.freeze()
    import torch

    if env.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    # fairseq-train sets up its logging (INFO, stdout) when its module is imported, before
    # fairseq's own import leaves a DEBUG handler: so here too, from none
    logging.root.handlers.clear()
    sys.modules.pop(module, None)
    train = importlib.import_module(module)
    sys.argv = [train.__file__, *argv]  # as python -m MODULE has it
    train.cli_main()
