"""The official global batch on any number of GPUs: --global-batch-size derives --update-freq."""

import pytest

from electra_plugin.models.core.run_config import update_freq_for
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import REPO, built_from_command_line, composed, records, run_here, train_cmd

CONFIG_DIR = REPO / "examples" / "pretraining" / "config"
OFFICIAL_BATCH = {"electra_small": 128, "electra_base": 256, "electra_large": 2048}
# docs/long_runs.md's table: per-GPU dataset.batch_size on 1, 8 and 16 GPUs (None: the yaml's)
README_BATCH = {"electra_small": {1: None, 8: 16, 16: 8},
                "electra_base": {1: None, 8: None, 16: 16},
                "electra_large": {1: None, 8: None, 16: None}}


@pytest.mark.parametrize("recipe", sorted(OFFICIAL_BATCH))
def test_recipes_give_the_official_batch_on_1_8_16_gpus(recipe):
    yaml = composed(CONFIG_DIR, recipe)
    assert yaml.task.global_batch_size == OFFICIAL_BATCH[recipe]
    for gpus, batch in README_BATCH[recipe].items():
        batch = batch or yaml.dataset.batch_size
        freq = update_freq_for(yaml.task.global_batch_size, batch, gpus)
        assert batch * gpus * freq == OFFICIAL_BATCH[recipe], (gpus, batch, freq)


def test_update_freq_arithmetic_and_its_errors():
    assert update_freq_for(2048, 32, 1) == 64 and update_freq_for(2048, 32, 16) == 4
    with pytest.raises(ElectraUsageError, match="256 sequences per GPU, not a multiple of "
                                                "--batch-size 96; use a --batch-size that "
                                                "divides 256"):
        update_freq_for(2048, 96, 8)
    with pytest.raises(ElectraUsageError, match="does not split over 3 GPUs"):
        update_freq_for(128, 8, 3)
    with pytest.raises(ElectraUsageError, match="needs --batch-size"):
        update_freq_for(128, None, 1)


@pytest.mark.parametrize("workers, expected", [(1, 4), (2, 2)])
def test_the_task_sets_update_freq_for_the_run(data_bin, workers, expected):
    cfg, _, _ = built_from_command_line(data_bin, "--global-batch-size", "32",
                                        "--distributed-world-size", str(workers))
    assert list(cfg.optimization.update_freq) == [expected]


def test_a_different_update_freq_is_one_line(data_bin):
    with pytest.raises(ElectraUsageError, match="--update-freq 3 was given; drop one"):
        built_from_command_line(data_bin, "--global-batch-size", "32", "--update-freq", "3")


@pytest.mark.slow
def test_a_run_updates_on_the_global_batch(data_bin, tmp_path):
    result = run_here(train_cmd(data_bin, tmp_path, "--max-update", "2", "--global-batch-size",
                                "16", "--no-save", "--disable-validation"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["bsz"] for r in records(result.stdout)] == [16, 16]  # 2 batches of 8 each
    assert "--global-batch-size 16: 8 sequences x 1 GPU(s) x --update-freq 2" in \
        result.stdout + result.stderr
