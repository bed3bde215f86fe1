"""Loader workers stop when the epoch or validation they serve is over
(run/loader_workers.py): none is left for the garbage collector, which stopped each only
after torch's 5 s timeout."""

import gc
import multiprocessing

import pytest

from helpers import records, run_here, train_cmd

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("buffer", ["0", "10"])  # without and with fairseq's prefetch thread
def test_no_loader_worker_outlives_its_epoch(data_bin, tmp_path, buffer):
    before = set(multiprocessing.active_children())
    gc.disable()  # what a run leaves to the collector stays, to be seen
    try:
        result = run_here(train_cmd(data_bin, tmp_path, "--num-workers", "1",
                                    "--data-buffer-size", buffer, "--batch-size", "64",
                                    "--max-epoch", "2", "--no-save"))
        left = set(multiprocessing.active_children()) - before
    finally:
        gc.enable()
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["epoch"] for r in records(result.stdout, "valid")] == [1, 2], result.stdout[-2000:]
    assert not left, left  # two epochs and two validations, each with its own worker
