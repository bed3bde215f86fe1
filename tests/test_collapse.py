"""A collapsed pre-training (features that no longer depend on the input) is named in one
warning line: at the end of pre-training and at the start of a fine-tuning from it."""

import logging
import sys

import pytest
import torch

from electra_plugin.models.collapse import COLLAPSE_RATIO, input_dependence, warn_if_collapsed
from helpers import PLUGIN, checkpoint, failure, run, run_here, tiny_model, train_cmd

LAST_NORM = "discriminator.encoder.layer.{}.output.LayerNorm.weight"
WARNING = "the discriminator's features barely depend on its input"


def collapse(state, layers):
    """Zero the last layer's LayerNorm gain: every token then leaves with its bias alone."""
    with torch.no_grad():
        state[LAST_NORM.format(layers - 1)].zero_()


def test_a_healthy_and_a_collapsed_discriminator(caplog):
    model, _ = tiny_model()
    spread, reference = input_dependence(model)
    assert spread > COLLAPSE_RATIO * reference > 0  # a random initialisation is its own peer
    rng = torch.get_rng_state()
    with caplog.at_level(logging.WARNING):
        assert not warn_if_collapsed(model, "here", "do this")
        collapse(model.state_dict(keep_vars=True), 2)
        assert input_dependence(model)[0] < 1e-6
        assert warn_if_collapsed(model, "here", "do this")
    assert torch.equal(rng, torch.get_rng_state())  # the run's random stream is untouched
    lines = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("here: ") and lines[0].endswith("do this")


@pytest.mark.slow
def test_collapsed_checkpoint_warned_at_fine_tuning_and_at_the_end_of_pre_training(
        tmp_path, spm_data, pretrained):
    state = checkpoint(pretrained)
    collapse(state["model"], 4)  # electra_tiny: 4 layers
    collapsed = tmp_path / "collapsed.pt"
    torch.save(state, collapsed)
    from electra_plugin.cli import glue as glue_cli
    from helpers import write_rte

    glue_cli.main(["preprocess", "--task", "RTE", "--glue-dir",
                   str(write_rte(tmp_path / "RTE", 16, 8)), "--pretrain-data", str(spm_data),
                   "--destdir", str(tmp_path / "rte")])

    def finetune(start, save):
        return run_here([sys.executable, "-m", "fairseq_cli.train", tmp_path / "rte", "--user-dir",
                         PLUGIN, "--task", "sentence_prediction", "--criterion",
                         "sentence_prediction", "--arch", "electra_tiny", "--num-classes", "2",
                         "--init-token", "0", "--cpu", "--optimizer", "adam", "--lr", "1e-4",
                         "--batch-size", "8", "--max-update", "1", "--save-dir", save,
                         "--finetune-from-model", start, "--num-workers", "0",
                         "--data-buffer-size", "0"])

    proc = finetune(collapsed, tmp_path / "ft")
    assert proc.returncode == 0, failure("fine-tuning", proc)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if WARNING in line]
    assert len(lines) == 1 and f"fine-tuning from {collapsed}" in lines[0]
    assert "fine-tune from random initialisation" in lines[0]
    proc = finetune(pretrained, tmp_path / "ft-healthy")
    assert proc.returncode == 0 and WARNING not in proc.stdout + proc.stderr

    # pre-training that ends collapsed: one line after its last checkpoint
    cmd = train_cmd(spm_data, tmp_path / "pre", "--max-update", "2", "--restore-file",
                    collapsed, "--reset-optimizer", "--reset-dataloader", "--reset-meters",
                    "--lr", "1e-12", "--arch", "electra_tiny", "--num-layers", "4",
                    "--hidden-size", "128", "--ffn-size", "512", "--embedding-size", "64",
                    "--tokens-per-sample", "64", "--optimizer", "electra_adam",
                    "--disable-validation")
    proc = run(cmd)
    assert proc.returncode == 0, failure("pre-training", proc)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if WARNING in line]
    assert len(lines) == 1 and "pre-training ended at update 2" in lines[0]
