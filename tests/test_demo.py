"""The main job's own pieces on a real short run: the small_compute preset through
fairseq-hydra-train, its progress lines, the curves and the discriminator at work."""

import sys

import pytest

from electra_plugin.cli import demo
from helpers import REPO, failure, run


@pytest.mark.slow
def test_preset_run_progress_curves_and_held_out_sentence(spm_data, tmp_path):
    log_path = tmp_path / "pretrain.log"
    cmd = demo.preset_cmd(spm_data, tmp_path / "ck", 12, 1, log_path, "small_compute",
                          tmp_path / "hydra", REPO / "examples" / "pretraining" / "config")
    cmd += ["task.tokens_per_sample=32", "dataset.validate_interval_updates=6",
            "common.log_interval=3", "dataset.batch_size=8"]
    proc = run(cmd, cwd=tmp_path)
    assert proc.returncode == 0, failure("fairseq-hydra-train", proc)
    shown = [demo.pretraining_progress(12)(line) for line in proc.stdout.splitlines()]
    shown = [line for line in shown if line]
    assert [line.split("|")[0].split() for line in shown if line.startswith("train")] == \
        [["train", f"{u}/12"] for u in (3, 6, 9, 12)]
    assert all("disc_auc" in line and "gen_acc" in line for line in shown), shown

    png = tmp_path / "curves.png"
    train, valid = demo.plot_curves(log_path, png)
    assert png.stat().st_size > 10_000
    assert [r["num_updates"] for r in train] == [3, 6, 9, 12]
    assert [r["num_updates"] for r in valid] == [6, 12]
    assert all(0 <= r["disc_auc"] <= 1 and r["train_flops"] > 0 for r in train)

    sentence = demo.first_valid_sentence(spm_data)
    lines = demo.discriminator_at_work(str(tmp_path / "ck" / "checkpoint_last.pt"), spm_data,
                                       sentence)
    assert len(lines) > 5 and all(0 < float(line.split()[0]) < 1 for line in lines)
    assert all(("->" in line) == line.endswith("(replaced)") for line in lines)


def write_log(path, updates=(10, 20, 30)):
    """A pre-training log in fairseq's simple format, as the demo's curves read it."""
    path.write_text("".join(
        f"2026-01-01 00:00:{u:02d} | INFO | train_inner | epoch 001:     {u} / 40 loss={9 - u / 10}, "
        f"gen_loss={7 - u / 10}, disc_loss=0.{u}, gen_acc={u}.5, disc_auc=0.{50 + u}, "
        f"num_updates={u}, train_flops={u}e9\n" for u in updates))
    return path


def curves_in_a_process(tmp_path, configure: bool, file_size_limit=None):
    """Draw the demo's curves in a new process, its logging set up as scripts/demo.py's
    main() sets it up (or left as importing fairseq leaves it); with ``file_size_limit``, no
    file of the process may grow past it (``ulimit -f``: SIGXFSZ, which Python ignores, then
    EFBIG)."""
    limit = f"resource.setrlimit(resource.RLIMIT_FSIZE, ({file_size_limit},) * 2)\n"
    code = ("import resource, sys\n" + (limit if file_size_limit else "")
            + "from electra_plugin.cli.demo import plot_curves\n"
            "from electra_plugin.user_io.logs import configure_logging\n"
            + ("configure_logging('demo')\n" if configure else "")
            + "plot_curves(sys.argv[1], sys.argv[2])\n")
    return run([sys.executable, "-c", code, write_log(tmp_path / "pretrain.log"),
                tmp_path / "curves.png"], cwd=REPO)


@pytest.mark.slow  # a new process: in the fast tier, the fork server's only start (5 s)
def test_curves_print_no_debug_lines(tmp_path):
    bare = curves_in_a_process(tmp_path, configure=False)
    # importing fairseq leaves the root logger at DEBUG: matplotlib's font manager talks
    assert bare.returncode == 0 and "DEBUG" in bare.stdout + bare.stderr, bare.stderr[-2000:]
    proc = curves_in_a_process(tmp_path, configure=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "DEBUG" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert (tmp_path / "curves.png").stat().st_size > 10_000


@pytest.mark.slow  # a new process, as above
def test_curves_written_whole(tmp_path):
    """A file-size limit (ulimit -f: a full disk without privileges) stops the PNG half-way:
    the previous curves stay as they were, and no partial file is left."""
    old = b"the previous run's curves"
    (tmp_path / "curves.png").write_bytes(old)
    proc = curves_in_a_process(tmp_path, configure=True, file_size_limit=4_000)
    assert proc.returncode != 0
    assert "(File too large)" in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
    assert (tmp_path / "curves.png").read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png", "pretrain.log"]
