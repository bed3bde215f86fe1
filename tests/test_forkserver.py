"""The fork server starts a ``python -m``, ``python -c`` or ``python SCRIPT.py`` command as a
new interpreter would: the same argv, cwd, import path, environment, logging, exit status and
streams; a pid to signal; its own random seeds; and so does the executable a shell script runs
as its ``python`` (warm_python), signals passed on (tests/forkserver.py)."""

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from forkserver import ForkedProcess, warm_python
from helpers import run

pytestmark = pytest.mark.slow  # a server's start-up: its imports

PROBE = textwrap.dedent("""
    import json, logging, os, random, sys, time, warnings
    import fairseq  # a command imports it before it configures logging (but fairseq_cli.train)
    import torch  # and builds an optimizer, whose first torch imports torch._dynamo
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    if sys.argv[1:] == ["sleep"]:
        print("ready", flush=True)
        time.sleep(60)
    print(json.dumps({
        "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
        "variable": os.environ.get("PROBE_VARIABLE"), "name": __name__,
        "root": [logging.root.level, [type(h).__name__ for h in logging.root.handlers]],
        "warnings": [[action, getattr(message, "pattern", message), category.__name__,
                      getattr(module, "pattern", module), line]
                     for action, message, category, module, line in warnings.filters],
        "warnoptions": sys.warnoptions,
        "random": random.random()}))
    print("to stderr", file=sys.stderr)
    sys.exit(3)
""")


# fairseq-train's module configures logging before it imports fairseq: code whose first
# import it is starts from a new interpreter's logging
FIRST = {"fairseq": "", "fairseq_cli.train": "import sys, torch\nfrom fairseq_cli import train\n"}


def probe_command(tmp_path, flag, first):
    """The probe as ``python -m``, ``-c`` or a script (flag ""), run from ``tmp_path``."""
    (tmp_path / "probe_module.py").write_text(FIRST[first] + PROBE)
    target = {"-m": "probe_module", "-c": FIRST[first] + PROBE}.get(flag)
    return [sys.executable, *((flag, target) if flag else ("probe_module.py",)), "a", "b c"]


# the forms of a command whose first import is each module: a new interpreter's state
# (logging, warning filters) depends on that import, not on the form
FORMS = {"fairseq": ("-m", "-c"), "fairseq_cli.train": ("-c", "")}


@pytest.mark.parametrize("first", FORMS)
def test_a_forked_command_is_a_new_process_of_that_command(tmp_path, first):
    """Each form forked twice against a new interpreter that ran the first form: the same
    environment, logging, warning filters, exit status and stderr; the form's own argv,
    import path and ``__main__``; a random seed of its own each."""
    # PYTHONWARNINGS as fairseq's loader sets it, and one more: their filters where a new
    # interpreter puts them
    env = {"PROBE_VARIABLE": "1",
           "PYTHONWARNINGS": "ignore:semaphore_tracker:UserWarning,error::ResourceWarning"}
    here = tmp_path.resolve()
    form = {"-m": ([str(here / "probe_module.py")], str(here)), "-c": (["-c"], ""),
            "": (["probe_module.py"], str(here))}  # flag -> (argv[:1], sys.path[0])
    runs = [(FORMS[first][0], run(probe_command(tmp_path, FORMS[first][0], first),
                                  cwd=tmp_path, env=env, fresh=True))]
    runs += [(flag, run(probe_command(tmp_path, flag, first), cwd=tmp_path, env=env))
             for flag in FORMS[first] for _ in range(2)]
    seen = []
    for flag, proc in runs:
        assert proc.returncode == 3 and proc.stderr == "to stderr\n", (flag, proc.stderr)
        seen.append(json.loads(proc.stdout.splitlines()[-1]))
        argv0, path0 = form[flag]
        assert seen[-1]["argv"] == [*argv0, "a", "b c"] and seen[-1]["path0"] == path0, seen[-1]
    randoms = [s.pop("random") for s in seen]
    for s in seen:
        del s["argv"], s["path0"]
    assert all(s == seen[0] for s in seen), seen
    assert seen[0]["name"] == "__main__" and seen[0]["variable"] == "1"
    assert seen[0]["warnoptions"] == env["PYTHONWARNINGS"].split(",")
    assert len(set(randoms)) == len(randoms)  # each its own seed, as new processes


def test_a_forked_command_can_be_killed_and_read_as_it_writes(tmp_path):
    (tmp_path / "probe_module.py").write_text(PROBE)
    proc = ForkedProcess([sys.executable, "-m", "probe_module", "sleep"], cwd=tmp_path)
    assert next(iter(proc.stdout)) == "ready\n"  # while it runs
    assert proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_trials_share_the_servers_fork_server_and_other_imports_start_their_own(tmp_path):
    """A forked command that starts a process from multiprocessing's fork server with the
    trials' imports (electra_plugin/speed/launch.py) gets the one the server started, the same
    for every command; with other imports (the benchmark harness's), its own, as a new
    process does."""
    (tmp_path / "probe.py").write_text(textwrap.dedent("""
        import multiprocessing, os, sys
        from electra_plugin.speed.launch import PRELOADED

        def report(queue):
            queue.put(os.getppid())  # the fork server's pid

        if __name__ == "__main__":
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOADED if sys.argv[1] == "trials" else ["json"])
            queue = context.Queue()
            process = context.Process(target=report, args=(queue,))
            process.start()
            process.join()
            print(queue.get(timeout=60), os.getpid())
    """))
    servers = {}
    for imports in ("trials", "trials", "other", "other"):
        proc = run([sys.executable, "probe.py", imports], cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        server, command = map(int, proc.stdout.split())
        servers.setdefault(imports, []).append(server)
        assert server != command
    assert servers["trials"][0] == servers["trials"][1], servers
    assert len(set(servers["other"]) | {servers["trials"][0]}) == 3, servers


def test_a_limited_command_is_limited_as_a_new_one_and_its_output_is_not(tmp_path):
    """``limits`` (a file-size limit here, as ``preexec_fn`` sets it on a new process) hold
    for the files a command and its children write, not for its stdout and stderr, which
    reach the test whole, in order, as a new process's pipes bring them."""
    code = textwrap.dedent("""
        import os, subprocess, sys
        print("o" * 5000)
        print("e" * 5000, file=sys.stderr)
        for name in ("mine", "childs"):
            try:
                if name == "mine":
                    with open(name, "wb") as f:
                        f.write(b"z" * 5000)
                else:
                    subprocess.run(["dd", "if=/dev/zero", "of=" + name, "bs=5000", "count=1"],
                                   check=True, capture_output=True)
            except (OSError, subprocess.CalledProcessError) as error:
                print(name, "stopped:", type(error).__name__, os.path.getsize(name))
        print("done", flush=True)
    """)
    cmd = [sys.executable, "-c", code]
    limits = {resource.RLIMIT_FSIZE: 1000}
    fresh = run(cmd, cwd=tmp_path, limits=limits, fresh=True)
    for name in ("mine", "childs"):
        (tmp_path / name).unlink()
    forked = ForkedProcess(cmd, cwd=tmp_path, limits=limits.items())
    out, err = forked.communicate(timeout=60)
    assert forked.returncode == fresh.returncode == 0, (out, err)
    assert out == fresh.stdout and err == fresh.stderr == "e" * 5000 + "\n"
    assert out.splitlines() == ["o" * 5000, "mine stopped: OSError 1000",
                                "childs stopped: CalledProcessError 1000", "done"], out


@pytest.mark.skipif(os.geteuid() != 0, reason="the power over file modes is root's")
def test_a_command_can_leave_roots_power_over_file_modes(tmp_path):
    """``file_modes``: root's command, forked or fresh, and what it starts, cannot write into
    a read-only directory; without it, they can."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    code = ("import pathlib, subprocess, sys\n"
            "print(subprocess.run(['touch', sys.argv[1] + '/started']).returncode)\n"
            "pathlib.Path(sys.argv[1], 'here').touch()\n")
    cmd = [sys.executable, "-c", code, locked]
    for fresh in (False, True):
        proc = run(cmd, file_modes=True, fresh=fresh)
        assert proc.returncode == 1 and proc.stdout == "1\n", (proc.stdout, proc.stderr)
        assert proc.stderr.strip().splitlines()[-1].startswith("PermissionError"), proc.stderr
    assert not list(locked.iterdir())
    proc = run(cmd)
    assert proc.returncode == 0 and proc.stdout == "0\n", proc.stderr
    assert sorted(p.name for p in locked.iterdir()) == ["here", "started"]


def test_a_shell_scripts_python_runs_warm_as_a_new_interpreter_would(tmp_path):
    """warm_python's executable: a script's streams (stdin included), argv, cwd, environment
    and exit status, as the interpreter's own; a signal it gets ends the command (timeout's
    124); the forms the server cannot start (``-V``, other start-up variables) run as
    themselves."""
    script = "; ".join([
        "set -u", "cd {dir}", "echo $$ > shell.pid",
        "echo input | $PY probe_module.py a 'b c' > forked.json 2> err", "echo $? > status",
        "timeout 2 $PY probe_module.py sleep > /dev/null", "echo $? >> status",
        "$PY -V >> status",
        "PYTHONPATH=/nowhere $PY -c 'import sys; print(sys.path[1])' >> status"])
    (tmp_path / "probe_module.py").write_text(  # its parent's pid and its own, in files
        "import os, pathlib, sys\npathlib.Path(sys.argv[1] + '.pids').write_text("
        "f'{os.getppid()} {os.getpid()}')\n"
        "if sys.argv[1] == 'a':\n    assert input() == 'input'\n" + PROBE)
    env = dict(os.environ, PROBE_VARIABLE="1")
    fresh = subprocess.run([sys.executable, "probe_module.py", "a", "b c"], cwd=tmp_path,
                           env=env, input="input\n", capture_output=True, text=True)
    env["PY"] = str(warm_python(tmp_path))
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", script.format(dir=tmp_path)], env=env, timeout=120)
    waited = time.monotonic() - started
    assert done.returncode == 0
    forked = json.loads((tmp_path / "forked.json").read_text().splitlines()[-1])
    expected = json.loads(fresh.stdout.splitlines()[-1])
    assert forked.pop("random") != expected.pop("random")
    assert forked == expected and (tmp_path / "err").read_text() == "to stderr\n"
    status = (tmp_path / "status").read_text().splitlines()
    assert status[:2] == ["3", "124"] and waited < 60, (status, waited)  # killed at 2 s
    # forked by the server, not started by the shell; the one killed is gone
    parent = (tmp_path / "a.pids").read_text().split()[0]
    assert parent != (tmp_path / "shell.pid").read_text().strip()
    with pytest.raises(ProcessLookupError):
        os.kill(int((tmp_path / "sleep.pids").read_text().split()[1]), 0)
    assert status[2] == f"Python {sys.version.split()[0]}" and status[3] == "/nowhere", status
