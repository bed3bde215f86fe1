"""A second fairseq-train into a live run's --save-dir stops; a killed run blocks nothing."""

import os
import subprocess

import pytest

from helpers import assert_one_line_error, checkpoint, digest, failure, records, run, train_cmd


SAVES = ("--save-interval-updates", "2", "--no-epoch-checkpoints", "--disable-validation")
# Real processes, not in process: the subject is a second run beside a live one, and the lock a
# SIGKILLed process leaves behind.


def start(cmd):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def read_until(proc, phrase, log):
    for line in proc.stdout:
        log.append(line)
        if phrase in line:
            return
    raise AssertionError("never printed " + phrase + "\n" + "".join(log[-40:]))


@pytest.mark.slow
def test_second_run_into_a_live_save_dir_stops_and_a_killed_run_resumes(tmp_path, data_bin):
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


@pytest.mark.slow
def test_runs_in_other_save_dirs_are_not_blocked(tmp_path, data_bin):
    first = start(train_cmd(data_bin, tmp_path / "a", "--max-update", "100000", *SAVES))
    log = []
    try:
        read_until(first, "num_updates", log)
        proc = run(train_cmd(data_bin, tmp_path / "b", "--max-update", "2", *SAVES))
        assert proc.returncode == 0, failure("a run beside a live one", proc)
    finally:
        first.kill()
        first.wait()
        first.stdout.close()
