"""The fast tier's rule (conftest.py): a test not marked slow cannot start fairseq-train;
the order the files run in, and the record of what each test costs."""

import json
import subprocess
import sys

import pytest

from helpers import REPO, run


def test_a_fast_test_cannot_start_fairseq_train():
    with pytest.raises(AssertionError, match="not marked slow but runs fairseq_cli.train"):
        subprocess.run([sys.executable, "-m", "fairseq_cli.train", "--help"], check=True)


def test_a_fast_test_may_start_other_commands():
    proc = subprocess.run([sys.executable, "-c", "print('fairseq_cli.train is just text')"],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("fairseq_cli.train")


def test_the_files_started_first_exist_and_come_first(request):
    """conftest.FILE_SECONDS names real files, and the collection starts with them, longest
    first (a renamed file would otherwise drop silently to its place by test count)."""
    from conftest import FILE_SECONDS

    tests = request.config.rootpath / "tests"
    assert all((tests / name).is_file() for name in FILE_SECONDS)
    order = list(dict.fromkeys(item.path.name for item in request.session.items))
    if set(FILE_SECONDS) <= set(order):  # the whole suite was collected
        longest = sorted(FILE_SECONDS, key=FILE_SECONDS.get, reverse=True)
        assert order[:len(FILE_SECONDS)] == longest


@pytest.mark.slow  # a pytest of its own: 4 s
def test_core_seconds_count_a_test_and_the_processes_it_starts(tmp_path):
    """--core-seconds: one JSON line a test, the busy CPU time of the processes it started
    included (a child that spins for half a CPU second)."""
    spin = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    (tmp_path / "test_spin.py").write_text(
        "import subprocess, sys\n\n\ndef test_spin():\n"
        f"    subprocess.run([sys.executable, '-c', {spin!r}], check=True)\n")
    out = tmp_path / "seconds.jsonl"
    proc = run([sys.executable, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider", "-p",
                "conftest", "test_spin.py", "--core-seconds", out], cwd=tmp_path,
               env={"PYTHONPATH": str(REPO / "tests")})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (record,) = map(json.loads, out.read_text().splitlines())
    assert record["test"] == "test_spin.py::test_spin", record
    assert record["core_seconds"] >= 0.45 and record["wall"] >= 0.5, record  # 10 ms ticks
