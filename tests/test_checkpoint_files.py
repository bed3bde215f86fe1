"""Every command that reads a checkpoint names a file that is not one in one line: what the
file is, never torch's advice to load it unsafely, and the file left as it was."""

import pickle
import zipfile

import pytest
import torch

from electra_plugin.cli import choice, convert, extract, finetune, glue, score, squad, tag
from electra_plugin.models.core.checkpoint import write_checkpoint
from electra_plugin.models.electra import ElectraModel
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import (assert_main_error, assert_usage_error, assert_usage_line, digest,
                     tiny_model, train_cmd)

# kind -> (a writer of such a file at a path, a phrase of the line it gets)
KINDS = {
    "text": (lambda p: p.write_text("epoch 3 | loss 2.1\nepoch 4 | loss 2.0\n"),
             "is not a checkpoint: it is a text file (it begins 'epoch 3 | loss 2.1')"),
    "empty": (lambda p: p.write_bytes(b""), "is damaged (the file is empty)"),
    "truncated": (lambda p: _cut_short(p), "is damaged (cut short or overwritten"),
    "zip": (lambda p: _zip_of(p, {"notes.txt": "a", "data/x.csv": "1,2"}),
            "is not a checkpoint: it is a zip archive of other files (notes.txt, data/x.csv)"),
    "pickle": (lambda p: p.write_bytes(pickle.dumps({"model": [1, 2, 3]})),
               "is not a checkpoint: it is a Python pickle of other data"),
    "torch_list": (lambda p: torch.save([torch.zeros(2)], p),
                   "is a PyTorch file but not a fairseq checkpoint: it holds a list"),
    "bare_weights": (lambda p: torch.save({"w": torch.zeros(2)}, p),
                     "it holds bare weights (a dict of w)"),
    "directory": (lambda p: p.mkdir(), "is a directory, not a checkpoint file"),
}


def _cut_short(path):
    model, _ = tiny_model()
    write_checkpoint(path, model.cfg, {"_name": "electra", "data": str(path.parent)},
                     model.state_dict())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _zip_of(path, members):
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)


# command -> argv for a checkpoint path, a data directory and a scratch directory: the
# checkpoint is read before the data is looked at
COMMANDS = {
    "electra-finetune trials": (finetune.main, lambda ck, d, tmp: [
        "trials", "--checkpoint", ck, "--task", f"RTE={d}", "--workdir", tmp / "w",
        "--trials", "1"]),
    "electra-finetune test-outputs": (finetune.main, lambda ck, d, tmp: [
        "test-outputs", "--checkpoint", ck, "--data", d, "--out-dir", tmp / "o"]),
    "electra-glue evaluate": (glue.main, lambda ck, d, tmp: [
        "evaluate", "--task", "RTE", "--checkpoint", ck, "--data", d]),
    "electra-convert export": (convert.main, lambda ck, d, tmp: [
        "export", ck, "--out", tmp / "hf"]),
    "electra-extract": (extract.main, lambda ck, d, tmp: [ck, "--out", tmp / "d.pt"]),
    "electra-tag predict": (tag.main, lambda ck, d, tmp: [
        "predict", "--checkpoint", ck, "--data", d, "--out", tmp / "p.conll"]),
    "electra-choice evaluate": (choice.main, lambda ck, d, tmp: [
        "evaluate", "--checkpoint", ck, "--data", d]),
    "electra-squad predict": (squad.main, lambda ck, d, tmp: [
        "predict", "--checkpoint", ck, "--data", d, "--out-dir", tmp / "sq"]),
    "electra-score score": (score.main, lambda ck, d, tmp: [
        "score", "--checkpoint", ck, "--data", d, "--input", tmp / "in.txt"]),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_names_a_file_that_is_not_a_checkpoint(command, kind, tmp_path, spm_data):
    write, phrase = KINDS[kind]
    path = tmp_path / "checkpoint_best.pt"
    write(path)
    before = None if path.is_dir() else digest(path)
    (tmp_path / "in.txt").write_text("the cat sees a house .\n")
    main, argv = COMMANDS[command]
    line = assert_main_error(main, argv(path, spm_data, tmp_path), str(path), phrase)
    assert "weights_only" not in line and "Traceback" not in line
    assert before is None or digest(path) == before


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_hub_names_a_file_that_is_not_a_checkpoint(kind, tmp_path, spm_data):
    write, phrase = KINDS[kind]
    write(tmp_path / "checkpoint_best.pt")
    with pytest.raises(ElectraUsageError) as caught:
        ElectraModel.from_pretrained(str(tmp_path), "checkpoint_best.pt", str(spm_data))
    assert_usage_line(caught.value, "checkpoint_best.pt", phrase)


@pytest.mark.parametrize("option", ["--restore-file", "--finetune-from-model"])
@pytest.mark.parametrize("kind", ["text", "truncated", "pickle", "directory"])
def test_fairseq_train_names_a_start_file_that_is_not_a_checkpoint(option, kind, tmp_path,
                                                                   data_bin):
    write, phrase = KINDS[kind]
    path = tmp_path / "start.pt"
    write(path)
    if kind == "directory":  # fairseq itself would start from scratch without a word
        phrase = f"{option} {path} is a directory, not a checkpoint file"
    assert_usage_error(train_cmd(data_bin, tmp_path / "save", "--max-update", "1", option, path),
                       str(path), phrase)
    assert not (tmp_path / "save" / "checkpoint_last.pt").exists()


def test_fairseq_train_names_a_restore_file_that_does_not_exist(tmp_path, data_bin):
    missing = tmp_path / "chekpoint_last.pt"  # a typo: fairseq would train from scratch
    assert_usage_error(train_cmd(data_bin, tmp_path / "save", "--max-update", "1",
                                 "--restore-file", missing),
                       f"--restore-file {missing} does not exist")
