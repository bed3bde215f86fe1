"""Damaged data and checkpoints get one line; a run killed at any moment resumes exactly."""

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from electra_plugin.cli import convert, extract, glue, prepare
from electra_plugin.models.core.checkpoint_file import checkpoint_damage
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import (
    PLUGIN, CreatesAFile, assert_main_error, assert_same_params, assert_usage_error, checkpoint,
    digest, failure, records, run_here, start, train_cmd, train_in_process, write_corpus, write_rte,
)

# The errors are checked where they are raised, in process (fairseq-train's main, our commands'
# mains); test_errors.py runs the command-line edge that turns them into one line once.


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


# ---------------------------------------------------------------------- 1. binarized data


def damage_truncated_bin(data):
    truncate(data / "train.bin")
    return "train.bin is truncated"


def damage_truncated_idx(data):
    (data / "train.idx").write_bytes((data / "train.idx").read_bytes()[:-100])
    return "train.idx is damaged"


def damage_bin_of_another_split(data):
    shutil.copyfile(data / "train.bin", data / "valid.bin")
    return "valid.bin does not match"


def damage_missing_bin(data):
    (data / "valid.bin").unlink()
    return "valid.bin is missing"


def damage_index_promises_more(data):
    """Rewrite the index so that its last sentence is 50 tokens longer than the data holds."""
    idx = bytearray((data / "train.idx").read_bytes())
    count = int.from_bytes(idx[18:26], "little")
    last = 26 + 4 * (count - 1)
    size = int.from_bytes(idx[last:last + 4], "little")
    idx[last:last + 4] = (size + 50).to_bytes(4, "little")
    (data / "train.idx").write_bytes(bytes(idx))
    return "train.bin is truncated"


@pytest.mark.parametrize("damage", [damage_truncated_bin, damage_truncated_idx,
                                    damage_bin_of_another_split, damage_missing_bin,
                                    damage_index_promises_more])
def test_damaged_split_is_named_when_it_loads(tmp_path, data_bin, damage):
    """Any task's split loads through fairseq's make_dataset, which the plugin checks."""
    import electra_plugin  # noqa: F401  (what --user-dir does: installs the check)
    from fairseq.data import Dictionary, data_utils

    data = tmp_path / "data"
    shutil.copytree(data_bin, data)
    phrase = damage(data)
    dictionary = Dictionary.load(str(data / "dict.txt"))
    with pytest.raises(ElectraUsageError, match="binarize the text again") as error:
        for split in ("train", "valid"):
            data_utils.load_indexed_dataset(str(data / split), dictionary)
    assert phrase in str(error.value) and str(data) in str(error.value)


def test_damaged_pretraining_data_through_fairseq_train(tmp_path, data_bin):
    data = tmp_path / "data"
    shutil.copytree(data_bin, data)
    phrase = damage_truncated_bin(data)
    line = assert_usage_error(train_cmd(data, tmp_path / "ck", "--max-update", "1"),
                              phrase, "binarize the text again")
    assert str(data) in line


@pytest.mark.slow
def test_damaged_finetuning_data(tmp_path, spm_data):
    data = tmp_path / "bin"
    glue.main(["preprocess", "--task", "RTE", "--glue-dir", str(write_rte(tmp_path / "RTE", 16, 8)),
               "--pretrain-data", str(spm_data), "--destdir", str(data)])
    truncate(data / "input0" / "train.bin", keep=0.9)
    assert_usage_error([sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN,
                        "--task", "sentence_prediction", "--arch", "electra_tiny", "--cpu",
                        "--criterion", "sentence_prediction", "--num-classes", "2",
                        "--init-token", "0", "--optimizer", "electra_adam", "--lr", "1e-5",
                        "--batch-size", "8", "--max-update", "1", "--save-dir", tmp_path / "ft",
                        "--num-workers", "0", "--data-buffer-size", "0"],
                       f"{data / 'input0' / 'train.bin'} is truncated")


# ---------------------------------------------------------------------- 2. checkpoints


@pytest.fixture
def damaged_checkpoint(tmp_path, pretrained):
    path = tmp_path / "damaged.pt"
    shutil.copyfile(pretrained, path)
    truncate(path, keep=0.6)  # what a copy cut short leaves
    return path


@pytest.mark.slow
def test_damaged_checkpoint_given_to_fairseq_train(tmp_path, data_bin, damaged_checkpoint):
    before = digest(damaged_checkpoint)
    for save, entry in ((tmp_path / "a", "--restore-file"),
                        (tmp_path / "b", "--finetune-from-model")):
        assert_usage_error(train_cmd(data_bin, save, "--max-update", "1",
                                     entry, damaged_checkpoint),
                           f"checkpoint {damaged_checkpoint} is damaged")
        assert not list(save.glob("*.pt"))
    assert digest(damaged_checkpoint) == before


@pytest.mark.slow
def test_damaged_checkpoint_given_to_the_hub_and_the_converter(tmp_path, spm_data,
                                                               damaged_checkpoint):
    from electra_plugin.models.hub_interface import from_pretrained

    with pytest.raises(ElectraUsageError, match="is damaged"):
        from_pretrained(str(damaged_checkpoint.parent), damaged_checkpoint.name, str(spm_data))
    assert_main_error(convert.main, ["export", damaged_checkpoint, "--out", tmp_path / "hf"],
                      f"checkpoint {damaged_checkpoint} is damaged")
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_checkpoint_damage_reads_checksums(tmp_path, pretrained):
    path = tmp_path / "flipped.pt"
    data = bytearray(pretrained.read_bytes())
    assert checkpoint_damage(pretrained, thorough=True) is None
    data[len(data) // 2] ^= 0xFF  # one byte inside a tensor: the archive still opens
    path.write_bytes(bytes(data))
    assert checkpoint_damage(path) is None
    assert "checksum" in checkpoint_damage(path, thorough=True)


PAYLOADS = {  # where in the checkpoint, and how deep
    **{kind: lambda state, obj: state["extra_state"].__setitem__("payload", obj)
       for kind in CreatesAFile.KINDS},
    "nested": lambda state, obj: state["extra_state"].__setitem__(
        "payload", {"runs": [{"deep": (1, [obj])}]}),
}
NAMED = {"method": "pathlib", "builtin": "open", "blocked module": "os.makedirs",
         "class": "logging.FileHandler", "nested": "pathlib"}


@pytest.mark.slow
@pytest.mark.parametrize("payload", PAYLOADS)
def test_checkpoint_with_objects_is_refused_everywhere_and_never_run(payload, tmp_path, spm_data,
                                                                   pretrained):
    """Each kind of object named by electra-extract; every other entry (fairseq-train's two,
    the hub, the converter) refuses one kind: they all read a checkpoint through the same
    check (models/core/checkpoint_file.py)."""
    from electra_plugin.models.hub_interface import from_pretrained

    marker = tmp_path / "was_run"
    state = torch.load(pretrained, map_location="cpu", weights_only=False)
    PAYLOADS[payload](state, CreatesAFile(marker, "method" if payload == "nested" else payload))
    foreign = tmp_path / "foreign.pt"
    torch.save(state, foreign)
    refused = f"checkpoint {foreign} is refused: it holds objects that are not plain weights"
    line = assert_main_error(extract.main, [foreign, "--out", tmp_path / "disc.pt"], refused)
    assert NAMED[payload] in line  # the object it names, read from the file
    if payload == "method":
        for entry in ("--restore-file", "--finetune-from-model"):
            assert_usage_error(train_cmd(spm_data, tmp_path / entry, "--max-update", "1", entry,
                                         foreign), refused, "nothing in it was run")
        with pytest.raises(ElectraUsageError, match=refused):
            from_pretrained(str(tmp_path), foreign.name, str(spm_data))
        assert_main_error(convert.main, ["export", foreign, "--out", tmp_path / "hf"], refused)
    assert not marker.exists()
    assert not (tmp_path / "hf").exists() and not (tmp_path / "disc.pt").exists()
    torch.load(foreign, weights_only=False)  # what the refusal prevented
    assert marker.exists(), "the test's payload does not run: the test proves nothing"


# ---------------------------------------------------------------------- 3. resume


SAVES = ("--save-interval-updates", "2", "--validate-interval-updates", "4",
         "--no-epoch-checkpoints")


def resume_cmd(data, save, updates):
    return train_cmd(data, save, "--max-update", str(updates), *SAVES)


def final_params(save):
    state = checkpoint(save / "checkpoint_last.pt")
    return state["optimizer_history"][-1]["num_updates"], state["model"]


@pytest.mark.slow
def test_damaged_last_checkpoint_resumes_from_the_newest_intact_one(tmp_path, data_bin):
    once, twice = tmp_path / "once", tmp_path / "twice"
    assert run_here(resume_cmd(data_bin, once, 10)).returncode == 0
    assert run_here(resume_cmd(data_bin, twice, 6)).returncode == 0
    truncate(twice / "checkpoint_last.pt")  # a kill during stock fairseq's copy leaves this
    proc = run_here(resume_cmd(data_bin, twice, 10))
    assert proc.returncode == 0, failure("resume", proc)
    warning = [line for line in proc.stdout.splitlines() if "is damaged" in line]
    assert warning and "resuming from" in warning[0], proc.stdout[-3000:]
    # resumed at update 6, the newest intact state (checkpoint_1_6.pt or its copy _best)
    assert [r["num_updates"] for r in records(proc.stdout)] == [7, 8, 9, 10]
    (n_a, a), (n_b, b) = final_params(once), final_params(twice)
    assert n_a == n_b == 10
    assert_same_params(a, b, atol=0, what="resumed past a damaged checkpoint_last.pt")


@pytest.mark.slow
def test_no_intact_checkpoint_left_is_one_line(tmp_path, data_bin):
    save = tmp_path / "ck"
    train_in_process(resume_cmd(data_bin, save, 2))
    for path in save.glob("*.pt"):
        truncate(path)
    before = {p.name: digest(p) for p in save.glob("*.pt")}
    assert before
    assert_usage_error(resume_cmd(data_bin, save, 4), "checkpoint_last.pt is damaged",
                       "no intact checkpoint")
    assert {p.name: digest(p) for p in save.glob("*.pt")} == before


def killed_at(cmd, trigger, delay, log):
    """Start ``cmd``; SIGKILL it ``delay`` s after the first stdout line holding ``trigger``.

    Returns True if it was killed, False if it finished first.
    """
    proc = start(cmd, merge_stderr=True)
    for line in proc.stdout:
        log.append(line)
        if trigger in line:
            time.sleep(delay)
            proc.kill()
            proc.wait()
            proc.stdout.close()
            return True
    assert proc.wait() == 0, "".join(log[-40:])
    return False


@pytest.mark.slow
def test_killed_at_random_moments_ends_like_an_uninterrupted_run(tmp_path, data_bin):
    """SIGKILL during updates, validation and saves (several times), then the same command.
    Real processes: the subject is a process killed at any moment, which needs one."""
    once, killed = tmp_path / "once", tmp_path / "killed"
    updates = 16
    assert run_here(resume_cmd(data_bin, once, updates)).returncode == 0
    rng = random.Random(0)
    triggers = ['"num_updates": "3"', "begin validation", "Preparing to save checkpoint",
                "Preparing to save checkpoint", '"num_updates": "11"', "Preparing to save"]
    log, kills = [], 0
    for trigger in triggers:
        kills += killed_at(resume_cmd(data_bin, killed, updates), trigger,
                           rng.uniform(0, 0.05), log)
        # whatever the moment, no checkpoint file is left damaged
        for path in killed.glob("*.pt"):
            assert checkpoint_damage(path, thorough=True) is None, f"{path.name} damaged"
    assert kills >= 4, "".join(log[-40:])
    assert killed_at(resume_cmd(data_bin, killed, updates), "never printed", 0, log) is False
    (n_a, a), (n_b, b) = final_params(once), final_params(killed)
    assert n_a == n_b == updates
    assert_same_params(a, b, atol=0, what=f"killed {kills} times vs uninterrupted")


# ---------------------------------------------------------------------- 4. prepare_data


@pytest.mark.slow
def test_interrupted_prepare_data_is_refused_then_redone(tmp_path, data_bin):
    """electra-prepare SIGKILLed (a real process: the subject is the kill), then the refusals
    and the redo in process."""
    write_corpus(tmp_path / "corpus.txt", 1500, seed=2)
    dest = tmp_path / "bin"
    argv = ["--train", tmp_path / "corpus.txt", "--destdir", dest,
            "--sentencepiece-vocab-size", "80", "--no-byte-fallback", "--workers", "1"]
    cmd = [sys.executable, "-m", "electra_plugin.cli.prepare", *argv]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([str(c) for c in cmd], stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    for line in proc.stderr:
        if "encoded valid" in line:  # binarizing next
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    proc.stderr.close()
    assert not (dest / "dict.txt").exists()
    assert_usage_error(train_cmd(dest, tmp_path / "ck", "--max-update", "1"),
                       "interrupted", "--force")
    assert_main_error(prepare.main, argv, "interrupted run", "--force")
    assert prepare.main([str(a) for a in argv + ["--force"]]) == 0
    assert not [p for p in dest.iterdir() if p.name.startswith(".prepare_data-")]
    train_in_process(train_cmd(dest, tmp_path / "ck", "--max-update", "1",
                               "--disable-validation"))
    assert checkpoint(tmp_path / "ck" / "checkpoint_last.pt")["optimizer_history"][-1][
        "num_updates"] == 1



def test_refusal_read_from_the_file_not_from_the_error(tmp_path):
    """The objects a pickle names are read from its opcodes (nothing runs), in both of
    torch's formats; a plain checkpoint names none, and a malformed pickle is not a refusal
    whatever its error says."""
    import pickle

    from electra_plugin.models.core.checkpoint_file import refused_pickle_error, unsafe_globals

    marker = tmp_path / "was_run"
    for legacy in (False, True):
        path = tmp_path / f"payload{legacy}.pt"
        torch.save({"model": {"w": torch.ones(2)}, "x": [CreatesAFile(marker, "builtin")]}, path,
                   _use_new_zipfile_serialization=not legacy)
        assert "io.open" in unsafe_globals(path)
        error = pickle.UnpicklingError("worded any way at all")
        assert "is refused" in str(refused_pickle_error(path, error))
        assert refused_pickle_error(path, ValueError("GLOBAL")) is None  # not the loader's
        plain = tmp_path / f"plain{legacy}.pt"
        torch.save({"model": {"w": torch.ones(2)}, "cfg": {"a": [1, "b"]}}, plain,
                   _use_new_zipfile_serialization=not legacy)
        assert unsafe_globals(plain) == []
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x80\x04not a pickle at all")
    assert unsafe_globals(garbage) == []
    assert refused_pickle_error(garbage, pickle.UnpicklingError("GLOBAL allowlist")) is None
    assert not marker.exists()
