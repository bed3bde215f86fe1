"""The fork server starts a ``python -m`` or ``python -c`` command as a new interpreter would:
the same argv, cwd, import path, environment, logging, exit status and streams; a pid to
signal; its own random seeds (tests/forkserver.py)."""

import json
import os
import signal
import sys
import textwrap

import pytest

from forkserver import ForkedProcess
from helpers import run

pytestmark = pytest.mark.slow  # a server's start-up: its imports

PROBE = textwrap.dedent("""
    import json, logging, os, random, sys, time
    import fairseq  # a command imports it before it configures logging (but fairseq_cli.train)
    if sys.argv[1:] == ["sleep"]:
        print("ready", flush=True)
        time.sleep(60)
    print(json.dumps({
        "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
        "variable": os.environ.get("PROBE_VARIABLE"), "name": __name__,
        "root": [logging.root.level, [type(h).__name__ for h in logging.root.handlers]],
        "random": random.random()}))
    print("to stderr", file=sys.stderr)
    sys.exit(3)
""")


# fairseq-train's module configures logging before it imports fairseq: code whose first
# import it is starts from a new interpreter's logging
FIRST = {"fairseq": "", "fairseq_cli.train": "import sys, torch\nfrom fairseq_cli import train\n"}


@pytest.mark.parametrize("flag, first", [("-m", "fairseq"), ("-c", "fairseq"),
                                         ("-c", "fairseq_cli.train")])
def test_a_forked_command_is_a_new_process_of_that_command(tmp_path, flag, first):
    (tmp_path / "probe_module.py").write_text(FIRST[first] + PROBE)
    target = "probe_module" if flag == "-m" else FIRST[first] + PROBE
    cmd = [sys.executable, flag, target, "a", "b c"]
    fresh = run(cmd, cwd=tmp_path, env={"PROBE_VARIABLE": "1"}, fresh=True)
    forked = [run(cmd, cwd=tmp_path, env={"PROBE_VARIABLE": "1"}) for _ in range(2)]
    assert fresh.returncode == forked[0].returncode == 3
    assert fresh.stderr == forked[0].stderr == "to stderr\n"
    seen = [json.loads(p.stdout.splitlines()[-1]) for p in (fresh, *forked)]
    randoms = [s.pop("random") for s in seen]
    assert seen[0] == seen[1] == seen[2], seen
    argv0 = str(tmp_path / "probe_module.py") if flag == "-m" else "-c"
    assert seen[0]["argv"] == [argv0, "a", "b c"]
    assert seen[0]["name"] == "__main__" and seen[0]["variable"] == "1"
    assert len(set(randoms)) == 3  # each its own seed, as new processes


def test_a_forked_command_can_be_killed_and_read_as_it_writes(tmp_path):
    (tmp_path / "probe_module.py").write_text(PROBE)
    proc = ForkedProcess([sys.executable, "-m", "probe_module", "sleep"], cwd=tmp_path)
    assert next(iter(proc.stdout)) == "ready\n"  # while it runs
    assert proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


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
