"""A writer that runs out of room (here a file-size limit, ``ulimit -f``, which needs no
privilege) ends in one line and leaves nothing that looks like a finished output."""

import resource
import sys

import pytest

from helpers import (
    GLUE, REPO, assert_one_line_error, command, run, squad_json, train_cmd, write_corpus,
    write_json, write_rte,
)


FULL = "(File too large); nothing of this run's output was left there"


def limited(cmd, limit_bytes):
    """Run ``cmd`` with no file of its (or its children's) larger than ``limit_bytes``.

    Processes, not in process: the limit (RLIMIT_FSIZE, then SIGXFSZ) is set in the command's
    process before it runs; set here it would stop pytest's own writes."""
    return run(cmd, limits={resource.RLIMIT_FSIZE: limit_bytes})


@pytest.mark.slow
def test_glue_and_squad_preprocess(tmp_path, spm_data):
    rte = write_rte(tmp_path / "RTE", 96, 40)
    dest = tmp_path / "glue"
    proc = limited([*GLUE, "preprocess", "--task", "RTE", "--glue-dir", rte, "--pretrain-data",
                    spm_data, "--destdir", dest], 2_000)
    assert_one_line_error(proc, f"cannot write into {dest} {FULL}")
    assert not dest.exists()
    squad = write_json(tmp_path / "squad.json", squad_json())
    dest = tmp_path / "squad"
    dest.mkdir()
    (dest / "notes.txt").write_text("the user's own file\n")
    proc = limited(command("squad", "preprocess", "--pretrain-data", spm_data, "--train", squad,
                           "--destdir", dest, "--max-seq-len", "64", "--doc-stride", "16",
                           "--max-query-len", "16"), 2_000)
    assert_one_line_error(proc, f"cannot write into {dest} {FULL}")
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]  # what was there before stays


@pytest.mark.slow
def test_extract_and_export(tmp_path, pretrained):
    limit = pretrained.stat().st_size // 4
    out = tmp_path / "disc.pt"
    proc = limited(command("extract", pretrained, "--out", out), limit)
    assert_one_line_error(proc, f"cannot write into {tmp_path} {FULL}")
    assert not list(tmp_path.iterdir())  # neither disc.pt nor fairseq's disc.pt.tmp
    out = tmp_path / "hf"
    proc = limited(command("convert", "export", pretrained, "--out", out), limit)
    assert_one_line_error(proc, f"cannot write into {out} {FULL}")
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.slow
def test_fairseq_train_checkpoint(tmp_path, data_bin):
    """fairseq-train's checkpoint among the writers checked: one line, no checkpoint cut short
    (fairseq tries torch.save three times, 2.5 s apart, before it gives up)."""
    save = tmp_path / "ck"
    proc = limited(train_cmd(data_bin, save, "--max-update", "2", "--disable-validation"),
                   100_000)
    assert_one_line_error(proc, f"could not write a checkpoint into {save} (File too large)",
                          "the checkpoints already there are intact")
    assert not list(save.glob("*.pt"))  # no checkpoint cut short under a checkpoint's name


@pytest.mark.slow
def test_prepare_through_the_demo(tmp_path):
    """The demo stops with the line of the step that could not write: electra-prepare, a
    process of its own under the same limit, which leaves no data-bin behind."""
    write_corpus(tmp_path / "corpus.txt", 1500, seed=2)  # ~55 kB of text
    work = tmp_path / "work"
    proc = limited([sys.executable, REPO / "scripts" / "demo.py", "--corpus",
                    tmp_path / "corpus.txt", "--out-dir", work, "--vocab-size", "80"], 20_000)
    assert_one_line_error(proc, f"cannot write into {work / 'data-bin'} {FULL}")
    assert not (work / "data-bin").exists()
