"""A writer whose destination is read-only ends in one line and writes nothing there.

We run as root in CI, where a mode of 0o555 stops nobody: the commands run without the
capability that overrides file modes (forked, the fork server's child drops it; fresh, under
``setpriv --bounding-set=-dac_override``; an unprivileged user needs nothing), so a
read-only directory is read-only to them.
"""

import os
import shutil
import sys

import pytest

from helpers import (
    GLUE, REPO, assert_one_line_error, command, run, squad_json, write_corpus, write_json,
    write_rte,
)

pytestmark = pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"),
                                reason="root needs setpriv to be stopped by file modes")


def read_only_dir(path):
    path.mkdir()
    path.chmod(0o555)
    return path


def as_user(cmd):
    """``cmd`` without root's power to write where file modes say no (a process of its own:
    the capability is dropped for that process only, which pytest's own cannot give up and
    get back)."""
    return run(cmd, file_modes=True)


@pytest.mark.slow
def test_prepare_and_the_demo(tmp_path):
    """electra-prepare into a read-only directory, and into a new one inside it (the demo's
    first step, whose line the demo ends with); the demo's own work directory inside it."""
    write_corpus(tmp_path / "corpus.txt", 300, seed=2)
    locked = read_only_dir(tmp_path / "locked")
    proc = as_user(command("prepare", "--train", tmp_path / "corpus.txt", "--out-dir", locked,
                           "--sentencepiece-vocab-size", "80", "--workers", "1"))
    assert_one_line_error(proc, f"--out-dir '{locked}'", "Permission denied", "you can write to")
    for work, dest in ((locked, locked / "data-bin"), (locked / "work", locked / "work")):
        proc = as_user([sys.executable, REPO / "scripts" / "demo.py", "--corpus",
                        tmp_path / "corpus.txt", "--out-dir", work, "--vocab-size", "80"])
        assert_one_line_error(proc, f"'{dest}'", "Permission denied", "you can write to")
    assert not list(locked.iterdir())


@pytest.mark.slow
def test_glue_and_squad_preprocess(tmp_path, spm_data):
    rte = write_rte(tmp_path / "RTE", 96, 40)
    squad = write_json(tmp_path / "squad.json", squad_json())
    locked = read_only_dir(tmp_path / "locked")
    for dest in (locked, locked / "new"):
        proc = as_user([*GLUE, "preprocess", "--task", "RTE", "--glue-dir", rte,
                        "--pretrain-data", spm_data, "--out-dir", dest])
        assert_one_line_error(proc, str(dest), "Permission denied", "you can write to")
        proc = as_user(command("squad", "preprocess", "--pretrain-data", spm_data, "--train",
                               squad, "--out-dir", dest, "--max-seq-len", "64",
                               "--doc-stride", "16", "--max-query-len", "16"))
        assert_one_line_error(proc, str(dest), "Permission denied", "you can write to")
    assert not list(locked.iterdir())


@pytest.mark.slow
def test_extract_and_export(tmp_path, pretrained):
    locked = read_only_dir(tmp_path / "locked")
    proc = as_user(command("extract", pretrained, "--out", locked / "disc.pt"))
    assert_one_line_error(proc, str(locked), "Permission denied", "you can write to")
    for out in (locked, locked / "hf"):
        proc = as_user(command("convert", "export", pretrained, "--out", out))
        assert_one_line_error(proc, str(out), "Permission denied", "you can write to")
    assert not list(locked.iterdir())
