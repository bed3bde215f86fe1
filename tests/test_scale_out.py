"""Runs that outgrow one machine: two nodes under torchrun equal one process with
--update-freq 2 and write through rank 0 only, and a run resumed on another number of
processes keeps its global batch and continues the epoch without repeating or skipping
a batch (docs/long_runs.md, "Several nodes")."""

import sys

import pytest

from electra_plugin.run.save_dir_lock import LOCK_FILE
from electra_plugin.run.scale_out import continued_position
from electra_plugin.user_io.errors import ElectraUsageError
from forkserver import warm_python
from helpers import (assert_metrics_equal, assert_same_params, assert_usage_error, binarize,
                     checkpoint, ddp_options, ddp_train, free_port, records, run_together,
                     train, train_cmd, write_corpus)

DETERMINISTIC = ("--temperature", "0", "--dropout", "0", "--attention-dropout", "0",
                 "--disable-validation", "--no-epoch-checkpoints")
GLOBAL_BATCH = ("--global-batch-size", "16")  # 8 sequences per batch: 2 batches per update


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    """A corpus of 4 updates of 16 sequences per epoch, so that runs cross epochs."""
    root = tmp_path_factory.mktemp("small")
    write_corpus(root / "train.txt", 200, seed=0)
    write_corpus(root / "valid.txt", 40, seed=1)
    return binarize(root, root / "bin")


def node_cmd(node, port, data, save_dir, *extra):
    """fairseq-train as torchrun starts it on node ``node`` of two, one process each (its
    python forked warm: forkserver.warm_python)."""
    cmd = train_cmd(data, save_dir, *extra, "--distributed-world-size", "2",
                    "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp")
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
            str(node), "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
            str(port), "--no-python", warm_python(save_dir.parent), *cmd[1:]]


def sequences_per_epoch(*logs):
    """Sequences trained on in each epoch, summed over the per-update records of runs."""
    seen = {}
    for log in logs:
        for r in records(log):
            seen[int(r["epoch"])] = seen.get(int(r["epoch"]), 0) + int(r["bsz"])
    return seen


@pytest.mark.slow
def test_two_nodes_match_update_freq_2_and_only_rank_0_writes(data_bin, tmp_path):
    options = ("--max-update", "3", *DETERMINISTIC)
    single = train(data_bin, tmp_path / "one", "--update-freq", "2", *options)
    port = free_port()
    # node 1 is given a --save-dir of its own (a node's local disk): it must stay untouched
    saves = [tmp_path / "node0", tmp_path / "node1"]
    results = run_together([node_cmd(n, port, data_bin, saves[n], *options) for n in (0, 1)])
    assert all(code == 0 for code, _, _ in results), [err[-3000:] for _, _, err in results]
    assert_metrics_equal(records(single), records(results[0][1]), "update-freq 2 vs 2 nodes")
    assert_same_params(checkpoint(tmp_path / "one" / "checkpoint_last.pt")["model"],
                       checkpoint(saves[0] / "checkpoint_last.pt")["model"], atol=1e-5,
                       what="update-freq 2 vs 2 nodes")
    # one checkpoint per save, the lock taken by rank 0 alone
    assert sorted(p.name for p in saves[0].iterdir()) == \
        sorted(p.name for p in (tmp_path / "one").iterdir())
    assert (saves[0] / LOCK_FILE).read_text().startswith("pid ")
    assert not saves[1].exists()

    # resuming, rank 1 sees no checkpoint where rank 0 sees one: both stop, in one line (the
    # ranks started as ddp_train starts them: the check is the same whoever starts them)
    port = free_port()
    results = run_together([train_cmd(data_bin, saves[n], "--max-update", "4", *DETERMINISTIC,
                                      *ddp_options(n, 2, port)) for n in (0, 1)])
    for code, _, err in results:
        assert code != 0
        assert "is seen by rank(s) 0 but not by rank(s) 1" in err, err[-3000:]
        assert "put --save-dir on a file system that every node mounts" in err


@pytest.fixture(scope="module")
def once(small_data, tmp_path_factory):
    """7 updates on one process, in one go -> (its log, its save dir)."""
    save = tmp_path_factory.mktemp("once")
    return train(small_data, save, "--max-update", "7", *GLOBAL_BATCH, *DETERMINISTIC), save


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)])
def test_resuming_on_another_world_size_continues_the_epoch(before, after, small_data, once,
                                                            tmp_path):
    """2 updates on ``before`` processes, then to 7 on ``after`` == 7 on one process: the
    same records update by update, the same weights, and each epoch's 64 sequences once."""
    options = (*GLOBAL_BATCH, *DETERMINISTIC)
    once_log, once_dir = once
    logs = []
    for workers, updates in ((before, "2"), (after, "7")):
        if workers == 1:
            logs.append(train(small_data, tmp_path / "moved", "--max-update", updates, *options))
        else:
            logs.append(ddp_train(small_data, tmp_path / "moved", "--max-update", updates,
                                  *options)[0][0])
    assert sequences_per_epoch(*logs) == sequences_per_epoch(once_log) == {1: 64, 2: 48}
    assert [r["num_updates"] for r in records(logs[1])] == [3, 4, 5, 6, 7]
    assert_metrics_equal(records(once_log), records(logs[0]) + records(logs[1]),
                         f"{before} then {after} process(es) vs one")
    assert "the epoch continues after its first 4 batches" in logs[1]
    assert_same_params(checkpoint(once_dir / "checkpoint_last.pt")["model"],
                       checkpoint(tmp_path / "moved" / "checkpoint_last.pt")["model"],
                       atol=1e-5, what=f"{before} then {after} process(es) vs one")


@pytest.mark.slow
def test_a_position_two_processes_cannot_continue_is_one_line(small_data, tmp_path):
    """3 batches into the epoch on one process without --global-batch-size: two processes
    would split the epoch's rest unevenly, so both refuse before training."""
    save = tmp_path / "run"
    train(small_data, save, "--max-update", "3", *DETERMINISTIC)
    port = free_port()
    results = run_together([train_cmd(small_data, save, "--max-update", "4", *DETERMINISTIC,
                                      *ddp_options(rank, 2, port)) for rank in (0, 1)])
    for code, out, err in results:
        assert code != 0 and "Traceback" not in err, err[-3000:]
        assert "was saved 3 batches into its epoch on 1 process(es), which 2 processes " \
               "cannot continue in step" in err
        assert "--reset-dataloader" in err


@pytest.mark.slow
def test_resuming_with_other_batches_is_one_line(small_data, tmp_path):
    save = tmp_path / "run"
    train(small_data, save, "--max-update", "2", *DETERMINISTIC)
    assert_usage_error(train_cmd(small_data, save, "--max-update", "3", *DETERMINISTIC,
                                 "--batch-size", "4"),
                       "was saved 2 batches into its epoch with --batch-size 8",
                       "this run makes other batches (--batch-size 4", "--reset-dataloader")


def test_positions_convert_by_batches_of_the_whole_epoch():
    layout = {"batch_size": 8, "max_tokens": None}
    two = dict(layout, world_size=2, update_freq=1)
    one = dict(layout, world_size=1, update_freq=2)
    four = dict(layout, world_size=4, update_freq=1)
    assert continued_position(two, one, 5, "ck.pt") == 10
    assert continued_position(one, two, 10, "ck.pt") == 5
    assert continued_position(two, four, 6, "ck.pt") == 3
    assert continued_position(two, two, 7, "ck.pt") == 7
    with pytest.raises(ElectraUsageError, match="saved 10 batches into its epoch on 2 "
                                                "process"):
        continued_position(two, four, 5, "ck.pt")
    # an epoch not yet begun continues anywhere, with any batches
    assert continued_position(two, dict(four, batch_size=4), 0, "ck.pt") == 0
