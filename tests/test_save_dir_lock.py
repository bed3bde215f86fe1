"""A second fairseq-train into a live run's --save-dir stops; a killed run blocks nothing,
not even while its data loader's workers outlive it."""

import os
import signal
import sys
from pathlib import Path

import pytest

import helpers
from helpers import (assert_one_line_error, assert_same_params, checkpoint, digest, failure,
                     records, run, train_cmd)

SAVES = ("--save-interval-updates", "2", "--no-epoch-checkpoints", "--disable-validation")
# Processes (forked by the fork server), not in process: the subject is a second run beside a
# live one, and the lock a SIGKILLed process leaves behind.


def start(cmd):
    return helpers.start(cmd, merge_stderr=True)


def read_until(proc, phrase, log):
    for line in proc.stdout:
        log.append(line)
        if phrase in line:
            return
    raise AssertionError("never printed " + phrase + "\n" + "".join(log[-40:]))


@pytest.mark.slow
def test_second_run_into_a_live_save_dir_stops_and_a_killed_run_resumes(tmp_path, data_bin):
    """Beside a live run: a second run into its --save-dir stops, one into another directory
    is not blocked; the live run, SIGKILLed, resumes."""
    save = tmp_path / "ck"
    first = start(train_cmd(data_bin, save, "--max-update", "100000", *SAVES))
    log = []
    try:
        read_until(first, "Finished saving checkpoint", log)
        before = {p.name: digest(p) for p in save.glob("*.pt")}
        # a short run, so that without the lock this test fails instead of running on
        second = run(train_cmd(data_bin, save, "--max-update", "4", *SAVES))
        assert_one_line_error(second, f"--save-dir {save} is in use", f"pid {first.pid} ",
                              "another --save-dir")
        assert not records(second.stdout)  # it stopped before its first update
        elsewhere = run(train_cmd(data_bin, tmp_path / "other", "--max-update", "2", *SAVES))
        assert elsewhere.returncode == 0, failure("a run beside a live one", elsewhere)
        assert first.poll() is None, "".join(log[-40:])  # the first run goes on
        # the second run wrote nothing: the files it saw are the first run's or newer
        assert before.keys() <= {p.name for p in save.glob("*.pt")}
    finally:
        first.kill()  # SIGKILL: no chance to release anything itself
        first.wait()
        first.stdout.close()
    saved = checkpoint(save / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"]
    proc = run(train_cmd(data_bin, save, "--max-update", str(saved + 2), *SAVES))
    assert proc.returncode == 0, failure("resume after SIGKILL", proc)
    assert [r["num_updates"] for r in records(proc.stdout)] == [saved + 1, saved + 2]


def parent(pid):
    """A process's parent, from Linux's /proc; None once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def children(pid):
    """The processes ``pid`` forked (its data loader's workers)."""
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and parent(p.name) == pid]


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_killed_beside_its_loader_workers_resumes_at_once(tmp_path, data_bin):
    """SIGKILL mid-epoch with two loader workers, twice, each time the same command at once:
    never refused, and it ends like a run never killed. A killed trainer's workers
    outlive it by up to 5 s (torch's check of their parent); here they are stopped first, so
    that they outlive it for the whole restart however slow the machine, then killed at the
    end. Real processes: the subject is the workers a killed process leaves behind."""
    updates = 6

    def cmd(save):
        return train_cmd(data_bin, save, "--max-update", str(updates), *SAVES,
                         "--num-workers", "2")

    once, killed = tmp_path / "once", tmp_path / "killed"
    whole = run(cmd(once))
    assert whole.returncode == 0, failure("the uninterrupted run", whole)
    log, lingering = [], []
    try:
        for kill_after in (3, 5):  # one update past a save: each restart resumes further
            proc = start(cmd(killed))
            try:
                read_until(proc, f'"num_updates": "{kill_after}"', log)
                workers = children(proc.pid)
                assert workers, "no loader worker: the test proves nothing"
                signal_all(workers, signal.SIGSTOP)
                lingering += workers
            finally:
                proc.kill()
                proc.wait()
                proc.stdout.close()
        saved = checkpoint(killed / "checkpoint_last.pt")["optimizer_history"][-1][
            "num_updates"]
        last = run(cmd(killed))
    finally:
        signal_all(lingering, signal.SIGKILL)
    log.append(last.stdout + last.stderr)
    assert "is in use" not in "".join(log), "".join(log)[-3000:]
    assert last.returncode == 0, failure("the restart after two kills", last)
    assert [r["num_updates"] for r in records(last.stdout)] == list(range(saved + 1,
                                                                          updates + 1))
    a, b = checkpoint(once / "checkpoint_last.pt"), checkpoint(killed / "checkpoint_last.pt")
    assert a["optimizer_history"][-1]["num_updates"] == updates
    assert b["optimizer_history"][-1]["num_updates"] == updates
    assert_same_params(a["model"], b["model"], atol=0, what="killed twice vs uninterrupted")


@pytest.mark.slow  # two processes importing the plugin
def test_a_python_caller_holds_its_save_dirs_until_it_releases_them(tmp_path):
    """Held by this process, a directory is refused to another process (the message names
    this pid); after release_save_dirs another process takes it."""
    from electra_plugin.run.save_dir_lock import hold_save_dir, release_save_dirs

    other = [sys.executable, "-c", "import sys; from electra_plugin.run.save_dir_lock import "
             "hold_save_dir; hold_save_dir(sys.argv[1])", str(tmp_path)]
    hold_save_dir(tmp_path)
    try:
        refused = run(other)
        assert refused.returncode != 0 and f"pid {os.getpid()}" in refused.stderr
    finally:
        release_save_dirs()
    taken = run(other)
    assert taken.returncode == 0, taken.stderr[-2000:]
