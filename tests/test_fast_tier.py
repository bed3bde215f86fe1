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
