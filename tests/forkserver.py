"""A warm interpreter that starts the tests' ``python -m MODULE ...`` and ``python -c CODE ...``
commands by forking.

A command's process costs about 4 seconds before its first line of work (the interpreter,
torch, fairseq's tasks and scikit-learn); the suite starts a few hundred. This server imports
those libraries once and forks a child per command, so a command is still a process of its
own (its exit status, its stderr, its pid to kill, its loader workers, its locks released at
its exit) that starts with the libraries loaded. It imports no module of the plugin and no
command module, so each command imports and registers the plugin as a new process does.
Two differences are left on purpose. The server imports torch._dynamo (0.7 s), which torch
imports when a command builds its first optimizer: a forked command that never does has two
library warning filters (sympy's deprecations, torch's TracerWarning) that a new one lacks.
And its garbage collector is the test process's (tests/conftest.py), inherited by each child:
the libraries frozen, the young generation collected every 50,000 allocations instead of 700.
Tests of a fresh interpreter itself (the installed console scripts, import-time behaviour)
start real processes (:func:`helpers.run` with ``fresh=True``). So does every command on a
machine with a CUDA GPU: there a forked child could not initialise CUDA ("Cannot re-initialize
CUDA in forked subprocess": 14 of the GPU tests of an H200 run failed so).

A command is ``python -m MODULE ...``, ``python -c CODE ...`` or ``python SCRIPT ...``.

Protocol, one JSON object per line: the client writes ``{"argv", "env", "cwd", "stdout",
"stderr", "file_modes", "limits"}`` (output file paths; whether root's power over file modes
is dropped; ``[resource, limit]`` pairs for setrlimit) on the server's stdin and reads
``{"pid"}`` back, then ``{"exit": pid, "code": ...}`` when that child ends (``code`` as
Popen's returncode). The server ends when its stdin closes.

Commands that a shell script starts reach the same server through :func:`warm_python`: an
executable that the script runs as its ``python``. It hands its argv, environment, working
directory and its own stdin, stdout and stderr to the server over its Unix socket, passes the
signals it gets on to the child and exits as the child did; a command the server cannot start
as a new interpreter would (another form, other start-up variables) runs as itself.

``electra-finetune trials`` starts its trials from the standard library's fork server; this
server starts that one once (:func:`start_trials_server`), and the commands it forks use it.
"""

import ast
import atexit
import contextlib
import ctypes
import functools
import gc
import importlib
import json
import logging
import multiprocessing.forkserver
import multiprocessing.process
import multiprocessing.resource_tracker
import os
import random
import re
import resource
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path


# what every command imports (torch._dynamo: when torch's first optimizer is built), and what
# torch imports at a command's first compile (0.4 of a tiny graphed run's 3.4 core-seconds);
# not the command modules themselves
PRELOADED = ("torch", "numpy", "scipy.stats", "sklearn.metrics", "torch.optim", "torch._dynamo",
             "torch._functorch.aot_autograd", "torch._dynamo.backends.debugging",
             "torch._inductor.debug", "fairseq.checkpoint_utils", "fairseq.dataclass.utils",
             "fairseq.options", "fairseq.tasks", "fairseq.trainer")
# Importing fairseq configures logging (wav2vec2_classification's basicConfig: DEBUG, stderr),
# as it does in a new process of every command but one that first imports this module, which
# configures its own (INFO, stdout) before it imports fairseq; such a command's child starts
# from logging as a new interpreter has it.
LOGGING_BEFORE_IMPORTS = ("fairseq_cli.train",)
# what a command may import before fairseq: packages that leave logging as they found it
QUIET_IMPORTS = {"numpy", "scipy", "sklearn", "torch", *sys.stdlib_module_names}


def first_import(code: str):
    """The first module that ``code`` imports outside QUIET_IMPORTS (for ``from package
    import name``, package.name), or None."""
    nodes = [node for node in ast.walk(ast.parse(code))
             if isinstance(node, (ast.Import, ast.ImportFrom))]
    for node in sorted(nodes, key=lambda node: (node.lineno, node.col_offset)):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [f"{node.module or ''}.{alias.name}" for alias in node.names]
        for name in names:
            if name.split(".")[0] not in QUIET_IMPORTS:
                return name
    return None


_startup_filters = 0  # how many warning filters the server's interpreter started with


def preload():
    global _startup_filters
    _startup_filters = len(warnings.filters)
    for name in PRELOADED:
        importlib.import_module(name)


def freeze_libraries() -> None:
    """The tests' collector (the test process's, and this server's, which its children
    inherit): what is there once the libraries are imported (millions of objects) becomes
    permanent, and the young generation runs every 50,000 allocations instead of 700. A tiny
    run allocates in bursts (hydra's composition of fairseq's config, dynamo's trace), and
    each full collection walked the whole heap (docs/testing.md)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def start_trials_server() -> None:
    """The standard library's fork server that ``electra-finetune trials`` starts its trials
    from (``PRELOADED`` of electra_plugin/speed/launch.py, read without importing the plugin),
    started once for every command this server forks: a trials command finds it running, as
    its later trials find the one its first trial started, and skips its seconds of imports."""
    source = (Path(__file__).resolve().parents[1] / "electra_plugin" / "speed" / "launch.py")
    assignment = next(node for node in ast.parse(source.read_text()).body
                      if isinstance(node, ast.Assign)
                      and getattr(node.targets[0], "id", None) == "PRELOADED")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(ast.literal_eval(assignment.value))
    multiprocessing.forkserver.ensure_running()


def share_trials_server() -> None:
    """In a child: the server's fork server for trials serves a command that asks for one with
    the same imports, as it serves the process that started it (the standard library would
    look for it by waiting on its own child; the benchmark harness asks for the same); a
    command that asks for other imports starts its own, as a new process does."""
    server = multiprocessing.forkserver._forkserver  # noqa: SLF001
    shared, imports, start_own = server._forkserver_pid, list(server._preload_modules), \
        server.ensure_running

    def ensure_running():
        if server._forkserver_pid == shared and list(server._preload_modules) != imports:
            os.close(server._forkserver_alive_fd)
            server._forkserver_pid = server._forkserver_address = None
            server._forkserver_alive_fd = None
        if server._forkserver_pid != shared:
            return start_own()
        return multiprocessing.resource_tracker.ensure_running()

    server.ensure_running = ensure_running


def warn_as_started(value: str) -> None:
    """The warning filters and options that a new interpreter makes of PYTHONWARNINGS
    ``value`` (the server starts without it): after those the libraries added since, before
    the interpreter's own."""
    options = [option for option in value.split(",") if option]
    sys.warnoptions[:0] = options
    libraries = warnings.filters[:len(warnings.filters) - _startup_filters]
    interpreters = warnings.filters[len(libraries):]
    warnings.filters[:] = []
    warnings._processoptions(options)  # noqa: SLF001 - the interpreter's own parsing
    warnings.filters[:0] = libraries
    warnings.filters.extend(interpreters)
    warnings._filters_mutated()  # noqa: SLF001


def exit_code(error: SystemExit) -> int:
    """What the interpreter exits with for ``raise SystemExit(error.code)``."""
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def obey_file_modes() -> None:
    """Leave this process and what it starts without CAP_DAC_OVERRIDE, root's power to write
    where file modes say no: what ``setpriv --bounding-set=-dac_override`` leaves a command."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # capabilities' version 3, this process
    sets = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (bits 0-31, 32-63)
    dac_override = 1
    if libc.prctl(24, dac_override, 0, 0, 0) or libc.capget(header, sets):  # PR_CAPBSET_DROP
        raise OSError(ctypes.get_errno(), "cannot drop CAP_DAC_OVERRIDE")
    for i in range(3):
        sets[i] &= ~(1 << dac_override)
    if libc.capset(header, sets):
        raise OSError(ctypes.get_errno(), "cannot drop CAP_DAC_OVERRIDE")


def set_limits(limits) -> None:
    """``limits`` (``(resource, limit)`` pairs) as this process's soft and hard limits."""
    for number, limit in limits:
        resource.setrlimit(number, (limit, limit))


def limit_resources(limits) -> int:
    """:func:`set_limits` on this process, as a ``preexec_fn`` does on a new one. Its stdout
    and stderr (the files the client reads) then pass through pipes to a relay process
    outside the limits, as a new process's pipes keep its output out of them. -> the relay's
    pid, for :func:`release_streams`."""
    pipes = {fd: os.pipe() for fd in (1, 2)}
    relay = os.fork()
    if relay == 0:  # copies each pipe into its file until every writer has closed it
        targets = {}
        for fd, (read, write) in pipes.items():
            os.close(write)
            targets[read] = fd
        while targets:
            for read in select.select(list(targets), [], [])[0]:
                data = os.read(read, 1 << 16)
                target = targets[read] if data else targets.pop(read)
                while data:
                    data = data[os.write(target, data):]
        os._exit(0)
    for fd, (read, write) in pipes.items():
        os.close(read)
        os.dup2(write, fd)
        os.close(write)
    set_limits(limits)
    return relay


def release_streams(relay: int) -> None:
    """At the exit of a process under :func:`limit_resources`: its output all in its files."""
    os.close(1)
    os.close(2)
    os.waitpid(relay, 0)


def streams_of(request) -> list:
    """A request's stdin, stdout and stderr as open descriptors: its output files."""
    output = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    errors = output if request["stderr"] is None else \
        os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    return [os.open(os.devnull, os.O_RDONLY), output, errors]


def child(request, streams) -> None:
    """Become the command: ``streams`` (descriptors) as its stdin, stdout and stderr, its cwd
    and environment, its module, code or script run as __main__; never returns."""
    code, relay = 1, None
    try:
        for fd, target in enumerate(streams):
            os.dup2(target, fd)
        for target in set(streams) - {0, 1, 2}:
            os.close(target)
        os.chdir(request["cwd"])
        multiprocessing.process.ORIGINAL_DIR = os.getcwd()  # a new interpreter's, at its start
        os.environ.clear()
        os.environ.update(request["env"])
        share_trials_server()
        warn_as_started(os.environ.get("PYTHONWARNINGS", ""))
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=unbuffered or stream is sys.stderr,
                               write_through=unbuffered)
        import numpy
        import torch
        if os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        random.seed()  # a new process's seeds, not the server's state
        numpy.random.seed()
        argv = request["argv"][1:]
        flag, target, args = (argv[0], argv[1], argv[2:]) if argv[0] in ("-m", "-c") else \
            ("", argv[0], argv[1:])  # a script
        try:
            if request.get("file_modes"):
                obey_file_modes()
            if request.get("limits"):
                relay = limit_resources(request["limits"])
            first = target if flag == "-m" else \
                first_import(Path(target).read_text() if not flag else target)
            if any(f"{first}.".startswith(f"{name}.") for name in LOGGING_BEFORE_IMPORTS):
                logging.root.handlers.clear()
                logging.root.setLevel(logging.WARNING)
            if not flag:
                sys.path[0] = os.path.dirname(os.path.realpath(target))  # the script's folder
                sys.argv = [target, *args]
                runpy.run_path(target, run_name="__main__")
            elif flag == "-m":
                sys.modules.pop(target, None)
                sys.path[0] = os.getcwd()  # where ``-m`` looks first (the server's: its folder)
                sys.argv = [target, *args]
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                sys.path[0] = ""  # where ``-c`` looks first: the working directory
                sys.argv = ["-c", *args]
                main = sys.modules["__main__"] = type(sys)("__main__")
                exec(compile(target, "<string>", "exec"), vars(main))
            code = 0
        except SystemExit as error:
            code = exit_code(error)
        except BaseException:  # noqa: BLE001 - printed as the interpreter prints it
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - the exit must happen
                pass
        if relay:
            release_streams(relay)
        os._exit(code)


def receive(connection):
    """A request from :func:`run_warm` on ``connection`` -> (request, its three streams)."""
    data, streams, _, _ = socket.recv_fds(connection, 1 << 16, 3)
    while not data.endswith(b"\n"):
        more = connection.recv(1 << 16)
        if not more:
            raise EOFError("the request ended early")
        data += more
    return json.loads(data), streams


def serve(name: str) -> None:
    """Fork the commands asked for on stdin and on the Unix socket ``name`` (Linux's abstract
    namespace: no file, no limit on the folder's path)."""
    # bound before the imports: a client may connect at once and wait
    listener = socket.socket(socket.AF_UNIX)
    listener.bind("\0" + name)
    listener.listen(64)
    os.write(1, b"listening\n")
    requests, replies = os.dup(0), os.fdopen(os.dup(1), "w", buffering=1)
    # the requests and replies are the server's own: what it and the trials' fork server
    # (which inherits its descriptors) print goes to its stderr, their stdin is empty
    empty = os.open(os.devnull, os.O_RDONLY)
    os.dup2(empty, 0)
    os.close(empty)
    os.dup2(2, 1)
    preload()
    start_trials_server()
    freeze_libraries()  # the children inherit it

    def tell(connection, reply):
        """A reply to the test process (stdin's requests: ``connection`` None) or a client."""
        line = json.dumps(reply) + "\n"
        if connection is None:
            replies.write(line)
        else:
            with contextlib.suppress(OSError):  # a client killed outright
                connection.sendall(line.encode())

    pending, owners = b"", {}  # owners: pid -> its client's socket, or None (stdin's)
    while True:
        ready, _, _ = select.select([requests, listener], [], [], 0.02)
        started = []  # (request, streams, the client's socket or None)
        if requests in ready:
            chunk = os.read(requests, 65536)
            if not chunk:
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                started.append((request, streams_of(request), None))
        if listener in ready:
            connection = listener.accept()[0]
            request, streams = receive(connection)
            if interpreter_settings(request["env"]) == interpreter_settings(os.environ):
                started.append((request, streams, connection))
            else:  # it runs as itself
                tell(connection, {"fresh": True})
                connection.close()
                for fd in streams:
                    os.close(fd)
        for request, streams, connection in started:
            pid = os.fork()
            if pid == 0:
                os.close(requests)
                replies.close()
                for other in [listener, *owners.values(), *(c for *_, c in started)]:
                    if other is not None:
                        other.close()
                child(request, streams)
            for fd in set(streams):
                os.close(fd)
            owners[pid] = connection
            tell(connection, {"pid": pid})
        for pid in list(owners):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                connection = owners.pop(pid)
                tell(connection, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
                if connection is not None:
                    connection.close()


def warm_form(argv, cwd=None) -> bool:
    """Whether the interpreter's arguments ``argv`` run a module, code or a script (a path
    from ``cwd``, the command's working directory)."""
    return len(argv) > 1 and argv[0] in ("-m", "-c") or len(argv) > 0 and \
        not argv[0].startswith("-") and os.path.isfile(os.path.join(cwd or "", argv[0]))


def run_warm(name, interpreter, argv) -> None:
    """``interpreter argv`` (this process's streams, environment and cwd) run by the server
    listening as ``name`` and waited for, the signals this process gets passed on to it: this
    process then exits as it did. A command the server cannot start (or no server) runs as
    itself."""
    reply = {"fresh": True}
    if warm_form(argv):
        with contextlib.suppress(OSError):
            connection = socket.socket(socket.AF_UNIX)
            connection.connect("\0" + name)
            request = {"argv": [interpreter, *argv], "env": dict(os.environ),
                       "cwd": os.getcwd()}
            socket.send_fds(connection, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
            answers = connection.makefile()
            reply = json.loads(answers.readline())
    if reply.get("fresh"):
        os.execv(interpreter, [interpreter, *argv])
    pid = reply["pid"]
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, lambda number, _: os.kill(pid, number))
    line = answers.readline()
    code = json.loads(line)["code"] if line else 1  # (no line: the server is gone)
    if code < 0:  # killed by a signal: so is this process
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def executable(path: Path, command: str) -> None:
    path.write_text(f"#!/bin/sh\nexec {command} \"$@\"\n")
    path.chmod(0o755)


def warm_python(folder: Path, commands=()) -> Path:
    """-> the path of an executable in ``folder`` that a shell script can run as its
    ``python`` (:func:`run_warm`: this process's server, on its socket; on a CUDA machine the
    interpreter itself), and beside it the console scripts named in ``commands``, each its
    installed script run by that python."""
    python = folder / "python"
    executable(python, f"'{sys.executable}'" if cuda_machine() else
               f"'{sys.executable}' -S -E '{__file__}' --run {running_server().name} "
               f"'{sys.executable}'")
    for command in commands:  # the installed script, run by that python
        executable(folder / command, f"'{python}' '{Path(sys.executable).with_name(command)}'")
    return python


# ------------------------------------------------------------------- the client's side

_server = None  # this process's Server, started by its first ForkedProcess or warm_python

APPLIED = ("PYTHONUNBUFFERED", "PYTHONWARNINGS")  # start-up variables a child applies itself


def interpreter_settings(env) -> dict:
    """The variables an interpreter reads as it starts (PYTHONPATH, PYTHONHASHSEED, ...), but
    those a child applies (APPLIED; not a script's own variables, such as PYTHON). fairseq's
    loader sets PYTHONWARNINGS in the process that trains, so the tests' later commands have it."""
    return {k: v for k, v in env.items()
            if re.fullmatch("PYTHON[A-Z0-9]+", k) and k not in APPLIED}


def server_environment() -> dict:
    """This environment without the variables a child applies: the server takes any value."""
    return {k: v for k, v in os.environ.items() if k not in APPLIED}


def forkable(cmd, env, cwd=None) -> bool:
    """Whether the server can start ``cmd`` in ``env`` from ``cwd`` as a new interpreter
    would: this interpreter running a module, code or a script, with the start-up settings
    the server started with."""
    started_with = os.environ if _server is None else _server.env
    return str(cmd[0]) == sys.executable and warm_form([str(c) for c in cmd[1:]], cwd) and \
        interpreter_settings(env) == interpreter_settings(started_with) and not cuda_machine()


@functools.cache
def cuda_machine() -> bool:
    """Whether torch sees a CUDA GPU here (then commands start as new interpreters); asked
    once, not at every command."""
    import torch
    return torch.cuda.is_available()


def running_server() -> "Server":
    """This process's server, started if it is not running."""
    global _server
    if _server is None or _server.process.poll() is not None:
        _server = Server()
    return _server


class Server:
    """The server as the test process sees it: one per process, started at the first command,
    listening on its socket ``name`` for warm_python's executables too."""

    def __init__(self):
        self.env = dict(os.environ)
        self.name = f"electra-fork-server-{os.getpid()}-{random.getrandbits(64):016x}"
        self.process = subprocess.Popen([sys.executable, __file__, self.name],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        bufsize=1, env=server_environment())
        if self.process.stdout.readline() != "listening\n":
            raise RuntimeError("the fork server did not start")
        self.started, self.codes = [], {}
        self.changed = threading.Condition()
        threading.Thread(target=self.read_replies, daemon=True).start()

    def read_replies(self):
        for line in self.process.stdout:
            reply = json.loads(line)
            with self.changed:
                if "exit" in reply:
                    self.codes[reply["exit"]] = reply["code"]
                else:
                    self.started.append(reply["pid"])
                self.changed.notify_all()

    def start(self, request) -> int:
        with self.changed:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            if not self.changed.wait_for(lambda: self.started or self.process.poll() is not None,
                                         timeout=60) or not self.started:
                raise RuntimeError("the fork server did not start the command")
            return self.started.pop(0)

    def wait(self, pid: int, timeout):
        with self.changed:
            if not self.changed.wait_for(lambda: pid in self.codes, timeout=timeout):
                return None
            return self.codes[pid]


class Lines:
    """A file the child writes, read as a pipe reads: line by line as they come, to the end
    once the child has ended."""

    def __init__(self, process, path: Path):
        self.process, self.path = process, path

    def __iter__(self):
        with open(self.path, errors="replace") as f:
            part = ""
            while True:
                ended = self.process.poll() is not None  # before reading: nothing comes after
                part += f.readline()
                if part.endswith("\n"):
                    yield part
                    part = ""
                elif ended:
                    rest = part + f.read()
                    yield from rest.splitlines(keepends=True)
                    return
                else:
                    time.sleep(0.01)

    def close(self):
        pass


class ForkedProcess:
    """What the tests use of a Popen (pid, poll, wait, kill, send_signal, communicate,
    returncode, stdout and stderr read line by line) for a command the server started; its
    output is text; ``merge_stderr`` puts stderr into stdout (Popen's stderr=STDOUT);
    ``file_modes``: run without root's power over file modes (:func:`obey_file_modes`);
    ``limits``: (resource, limit) pairs set on the command (:func:`limit_resources`)."""

    def __init__(self, cmd, env=None, cwd=None, merge_stderr=False, file_modes=False,
                 limits=()):
        self.server, self.args, self.returncode = running_server(), [str(c) for c in cmd], None
        self.folder = Path(tempfile.mkdtemp(prefix="forked-"))
        self.stdout = Lines(self, self.folder / "stdout")
        self.stderr = None if merge_stderr else Lines(self, self.folder / "stderr")
        for lines in (self.stdout, self.stderr):
            if lines is not None:
                lines.path.touch()  # to read from at once
        self.pid = self.server.start({
            "argv": self.args, "env": dict(os.environ if env is None else env),
            "cwd": str(cwd or os.getcwd()), "stdout": str(self.folder / "stdout"),
            "stderr": None if merge_stderr else str(self.folder / "stderr"),
            "file_modes": file_modes, "limits": [list(pair) for pair in limits]})

    def poll(self):
        if self.returncode is None:
            self.returncode = self.server.wait(self.pid, 0)
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            self.returncode = self.server.wait(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # ended since, as Popen has it
                os.kill(self.pid, sig)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout=None):
        self.wait(timeout)
        outputs = tuple(None if lines is None else lines.path.read_text(errors="replace")
                        for lines in (self.stdout, self.stderr))
        shutil.rmtree(self.folder, ignore_errors=True)
        return outputs


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:  # warm_python's executable
        run_warm(sys.argv[2], sys.argv[3], sys.argv[4:])
    serve(sys.argv[1])  # the name of its socket, for warm_python's executables
