"""The main job's own pieces on a real short run: the small_compute preset through
fairseq-hydra-train, its progress lines, the curves and the discriminator at work."""

import pytest

from electra_plugin import demo
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
