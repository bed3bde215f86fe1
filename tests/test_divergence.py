"""A run that diverges stops with one line naming the update; its checkpoints stay finite.

The runs are fairseq-train's main in process: the divergence is raised from the plugin's
wrapper of fairseq's ``Trainer.train_step`` / ``save_checkpoint``, outside any ``except`` of
fairseq's, so the ElectraUsageError reaches the caller as it is (the command line's one-line
edge is tested once, in test_errors.py). fairseq's log lines are read from ``caplog``."""

import logging

import pytest
import torch

from electra_plugin.models.core.checkpoint_file import checkpoint_damage
from helpers import assert_usage_line, checkpoint, digest, records, train_cmd, train_in_process


def with_options(cmd, **options):
    """``cmd`` with the values of some of its options replaced (``lr="1e30"``)."""
    cmd = list(cmd)
    for name, value in options.items():
        cmd[cmd.index("--" + name.replace("_", "-")) + 1] = value
    return cmd


def assert_finite_checkpoints(save, some=True):
    saved = sorted(save.glob("*.pt"))
    assert saved or not some, "no checkpoint was saved before the divergence"
    for path in saved:
        assert checkpoint_damage(path, thorough=True) is None, path.name
        for name, tensor in checkpoint(path)["model"].items():
            assert torch.isfinite(tensor.float()).all(), f"{path.name}: {name} is not finite"


def stopped(cmd, caplog):
    """``train_in_process(cmd)``, which must raise -> (the exception, its log as
    fairseq-train's stdout has it: ``... | train_inner | {...}`` lines)."""
    caplog.set_level(logging.INFO)
    caplog.clear()
    with pytest.raises(Exception) as caught:
        train_in_process(cmd)
    return caught.value, "\n".join(f"| {r.name} | {r.getMessage()}" for r in caplog.records)


def diverging_run(data, save, *extra):
    """Adam at lr 1e30: two finite updates, then NaN gradients at update 3."""
    return with_options(train_cmd(data, save, "--max-update", "20",
                                  "--save-interval-updates", "1", "--no-epoch-checkpoints",
                                  "--disable-validation", *extra), lr="1e30")


def test_nan_gradients_stop_with_the_update_and_the_last_finite_loss(tmp_path, data_bin,
                                                                      caplog):
    save = tmp_path / "ck"
    error, log = stopped(diverging_run(data_bin, save), caplog)
    finished = records(log)
    assert finished, log[-3000:]
    line = assert_usage_line(
        error, f"training diverged at update {len(finished) + 1}: its gradients are NaN/Inf",
        f"the last finite loss was {finished[-1]['loss']:.4g}, at update {len(finished)}",
        f"the checkpoints in {save} were saved before it and are intact",
        "a lower --lr", "--warmup-updates", "--clip-norm 1.0", "resume from checkpoint_last.pt")
    assert "--fp16" not in line  # an fp32 run is not told to leave fp16
    assert_finite_checkpoints(save)


def test_bf16_divergence(tmp_path, data_bin, caplog):
    cmd = diverging_run(data_bin, tmp_path / "ck", "--bf16")
    cmd[1:3] = ["-m", "electra_plugin.cli.train"]  # electra-train: --bf16 off the TPU
    error, _ = stopped(cmd, caplog)
    assert_usage_line(error, "training diverged at update", "NaN/Inf", "fp32 instead of --bf16")
    assert_finite_checkpoints(tmp_path / "ck")


def test_weights_made_infinite_are_never_saved(tmp_path, data_bin, caplog):
    """SGD at lr 1e38 overflows the weights in one update whose gradients are finite."""
    save = tmp_path / "ck"
    cmd = train_cmd(data_bin, save, "--max-update", "2", "--save-interval-updates", "1",
                    "--no-epoch-checkpoints", "--disable-validation")
    train_in_process(cmd)
    before = {p.name: digest(p) for p in save.glob("*.pt")}
    assert before
    resumed = with_options(cmd, optimizer="sgd", lr="1e38", warmup_updates="0",
                           max_update="4")
    # --reset-optimizer counts updates from 0 again
    error, log = stopped(resumed + ["--reset-optimizer"], caplog)
    update = int(records(log)[-1]["num_updates"])  # logged, then refused at its save
    assert_usage_line(error, f"training diverged at update {update}: its weights are NaN/Inf",
                      "that state was not saved", "resume from checkpoint_last.pt")
    assert {p.name: digest(p) for p in save.glob("*.pt")} == before
    assert_finite_checkpoints(save)


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 needs CUDA")
def test_fp16_loss_scale_at_its_minimum(tmp_path, data_bin, caplog):
    cmd = [c for c in diverging_run(data_bin, tmp_path / "ck", "--fp16") if c != "--cpu"]
    error, _ = stopped(cmd, caplog)
    assert_usage_line(error, "training diverged at update", "--bf16 or fp32")
    assert_finite_checkpoints(tmp_path / "ck", some=False)  # fp16 may skip every update


def test_amp_loss_scale_at_its_minimum_on_cpu(tmp_path, data_bin):
    """fairseq's own Trainer and AMPOptimizer in process, a CPU GradScaler standing in for the
    CUDA one: a scale of 1e38 overflows every fp32 gradient, and the next scale (5e37) is at
    --min-loss-scale, so fairseq raises 'Minimum loss scale reached' at the first update."""
    from fairseq.trainer import Trainer

    from helpers import built_from_command_line
    from electra_plugin.user_io.errors import ElectraUsageError

    cfg, task, model = built_from_command_line(
        data_bin, "--amp", "--min-loss-scale", "1e38", "--save-dir", str(tmp_path / "ck"))
    (tmp_path / "ck").mkdir()  # as fairseq-train makes it
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.optimizer._grad_scaler = torch.amp.GradScaler("cpu", init_scale=1e38)
    task.load_dataset("train")
    batches = trainer.get_train_iterator(epoch=1).next_epoch_itr(shuffle=False)
    with pytest.raises(ElectraUsageError) as stopped:
        trainer.train_step([next(batches)])
    line = str(stopped.value)
    for phrase in ("training diverged at update 1: the fp16 loss scale fell to --min-loss-scale",
                   "no update had finished", "--bf16 or fp32 instead of --fp16/--amp"):
        assert phrase in line, line
    assert "\n" not in line
    assert_finite_checkpoints(tmp_path / "ck", some=False)  # crash.pt, if any, is finite


def test_a_bounded_number_of_nonfinite_updates_is_skipped(tmp_path, data_bin, caplog):
    """--skip-nonfinite-updates 2 at lr 1e30: updates 3 and 3 again (the next batches) are
    skipped and logged, the third non-finite one stops the run with the divergence line."""
    save = tmp_path / "ck"
    error, log = stopped(diverging_run(data_bin, save, "--skip-nonfinite-updates", "2"), caplog)
    finished = records(log)
    skipped = [line for line in log.splitlines() if "skipped update" in line]
    assert len(skipped) == 2, log[-3000:]
    assert f"skipped update {len(finished) + 1}: its gradients are NaN/Inf" in skipped[0]
    assert "skip 2 of --skip-nonfinite-updates 2" in skipped[1]
    assert_usage_line(error, f"training diverged at update {len(finished) + 1}")
    assert_finite_checkpoints(save)
