"""The fast tier's rule (conftest.py): a test not marked slow cannot start fairseq-train."""

import subprocess
import sys

import pytest


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
