"""Bad input to fairseq-train gets one clear line, no traceback, and no lost files."""

import shutil
import sys

import pytest

from helpers import (
    assert_main_error, assert_one_line_error, assert_usage_error, binarize, digest, hydra_cmd,
    run, train_cmd, train_in_process, write_corpus,
)



@pytest.mark.slow
def test_missing_data_directory(tmp_path):
    cmd = train_cmd(tmp_path / "nowhere", tmp_path / "ck", "--max-update", "1")
    assert_usage_error(cmd, "does not exist", "electra-prepare")


@pytest.mark.slow
def test_missing_dictionary(tmp_path, data_bin):
    data = tmp_path / "data"
    shutil.copytree(data_bin, data)
    (data / "dict.txt").unlink()
    cmd = train_cmd(data, tmp_path / "ck", "--max-update", "1")
    assert_usage_error(cmd, "dict.txt is missing")


@pytest.mark.slow
def test_malformed_dictionary(tmp_path, data_bin):
    data = tmp_path / "data"
    shutil.copytree(data_bin, data)
    (data / "dict.txt").write_text("the\ncat 3\n")
    cmd = train_cmd(data, tmp_path / "ck", "--max-update", "1")
    assert_usage_error(cmd, "is not a fairseq dictionary")


@pytest.mark.slow
def test_data_binarized_with_another_dictionary(tmp_path, data_bin):
    data = tmp_path / "data"
    shutil.copytree(data_bin, data)
    lines = (data / "dict.txt").read_text().splitlines()
    (data / "dict.txt").write_text("\n".join(lines[:10]) + "\n")
    cmd = train_cmd(data, tmp_path / "ck", "--max-update", "1")
    assert_usage_error(cmd, "binarized with another dictionary", "--srcdict")


@pytest.mark.slow
def test_empty_split(tmp_path):
    write_corpus(tmp_path / "train.txt", 50, seed=0)
    (tmp_path / "valid.txt").write_text("")
    data = binarize(tmp_path, tmp_path / "bin")
    cmd = train_cmd(data, tmp_path / "ck", "--max-update", "1")
    assert_usage_error(cmd, "'valid' split", "is empty")


@pytest.mark.slow
def test_missing_split(tmp_path, data_bin):
    cmd = train_cmd(data_bin, tmp_path / "ck", "--max-update", "1", "--valid-subset", "test")
    assert_usage_error(cmd, "no 'test' split", "--valid-subset")


@pytest.mark.slow
def test_tokens_per_sample_longer_than_positions(tmp_path, data_bin):
    cmd = train_cmd(data_bin, tmp_path / "ck", "--max-update", "1", "--max-positions", "16")
    assert_usage_error(cmd, "--tokens-per-sample 32", "model's 16 positions")


@pytest.mark.slow
def test_generator_fraction_without_whole_heads(tmp_path, data_bin):
    assert_usage_error(train_cmd(data_bin, tmp_path / "ck", "--max-update", "1",
                         "--generator-size", "0.3"), "--generator-size 0.3", "attention heads")


@pytest.mark.slow
@pytest.mark.parametrize("option, value, said", [
    ("--length-buckets", "-1", "--length-buckets -1 must be at least 0"),
    ("--dropout", "1.5", "--dropout 1.5 must be in [0, 1)"),
    ("--temperature", "-1", "--temperature -1 must be at least 0"),
    ("--layer-decay", "1.5", "--layer-decay 1.5 is not in (0, 1]"),
    ("--lr", "-0.001", "--lr -0.001 is negative"),
])
def test_a_numeric_option_out_of_range(tmp_path, data_bin, option, value, said):
    optimizer = ("--optimizer", "electra_adam") if option in ("--layer-decay", "--lr") else ()
    assert_usage_error(train_cmd(data_bin, tmp_path / "ck", "--max-update", "1", *optimizer,
                                 option, value), said)
    assert not (tmp_path / "ck" / "checkpoint_last.pt").exists()


# A checkpoint that does not fit the model stops in fairseq's trainer, which turns any
# exception into its own ("Cannot load model parameters ..."): in process the ElectraUsageError
# is that exception's __context__ (assert_usage_error finds it); fairseq-train's command line
# lets the one line through, which test_command_lines_turn_it_into_one_line runs for real.


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, data_bin):
    save = tmp_path_factory.mktemp("ck")
    train_in_process(train_cmd(data_bin, save, "--max-update", "1", "--no-epoch-checkpoints"))
    return save


def test_restoring_a_checkpoint_of_another_size(tmp_path, data_bin, tiny_checkpoint):
    ckpt = tiny_checkpoint / "checkpoint_last.pt"
    before = digest(ckpt)
    save = tmp_path / "other"
    assert_usage_error(train_cmd(data_bin, save, "--max-update", "2", "--hidden-size", "128",
                                 "--restore-file", ckpt),
                       f"checkpoint {ckpt} does not fit this model",
                       "trained with --hidden-size 64 where this command gives --hidden-size "
                       "128", "--arch")
    assert digest(ckpt) == before
    assert not list(save.glob("*.pt"))


def test_resuming_in_a_save_dir_of_another_size_keeps_its_checkpoint(tmp_path, data_bin,
                                                                     tiny_checkpoint):
    save = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, save)
    before = {p.name: digest(p) for p in save.glob("*.pt")}
    assert_usage_error(train_cmd(data_bin, save, "--max-update", "3", "--num-layers", "3"),
                       "does not fit this model",
                       "--num-layers 2 where this command gives --num-layers 3")
    assert {p.name: digest(p) for p in save.glob("*.pt")} == before


def test_library_code_raises_a_catchable_error(tmp_path, monkeypatch):
    """In Python (hub interface, notebooks, servers) the error is an ordinary ValueError,
    whatever the process's command line looks like."""
    from electra_plugin.user_io.errors import ElectraUsageError
    from electra_plugin.models.electra import ElectraModel

    monkeypatch.setattr(sys, "argv", ["fairseq-train", "data-bin"])
    try:
        ElectraModel.from_pretrained(str(tmp_path / "nowhere"))
    except Exception as error:  # noqa: BLE001 - what a serving process would write
        caught = error
    assert isinstance(caught, ElectraUsageError) and isinstance(caught, ValueError)
    assert not isinstance(caught, SystemExit)
    assert str(caught).startswith("electra_plugin: error: ") and "\n" not in str(caught)


def assert_only_the_line_on_stderr(proc, *phrases):
    """Exit status 1 and stderr holding exactly the one error line: no traceback, nothing
    else."""
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert_one_line_error(proc, *phrases)


@pytest.mark.slow
def test_command_lines_turn_it_into_one_line(tmp_path, data_bin, tiny_checkpoint):
    """The one test of the command-line mechanism (every other error test runs in process):
    our commands (errors.command_line) and fairseq's own command lines (run/command_line: here
    hydra's, and fairseq-train's where the error is raised inside the trainer's checkpoint
    loading, which turns any Exception into its own) print the line and exit 1."""
    proc = run([sys.executable, "-m", "electra_plugin.cli.convert", "import",
                "--discriminator", tmp_path / "nowhere", "--out", tmp_path / "out"])
    assert proc.returncode == 1
    assert_one_line_error(proc, "nowhere")
    (tmp_path / "cwd").mkdir()
    proc = run(hydra_cmd("electra_small", data_bin, tmp_path / "ck", tmp_path / "hydra",
                         "+model.generator_size=0.3"), cwd=tmp_path / "cwd")
    assert proc.returncode == 1
    assert_one_line_error(proc, "--generator-size 0.3")
    ckpt = tiny_checkpoint / "checkpoint_last.pt"
    # Python's warnings (hydra's deprecations) off: all that is left on stderr is the error
    proc = run(train_cmd(data_bin, tmp_path / "other", "--max-update", "2", "--hidden-size",
                         "128", "--restore-file", ckpt), env={"PYTHONWARNINGS": "ignore"})
    assert_only_the_line_on_stderr(proc, f"checkpoint {ckpt} does not fit this model",
                                   "--hidden-size 64 where this command gives --hidden-size 128")
    assert "Cannot load model parameters" not in proc.stdout + proc.stderr
    assert not list((tmp_path / "other").glob("*.pt"))


@pytest.mark.slow
@pytest.mark.parametrize("other", [["--bf16"], ["--amp"], ["--fp16", "--fp16-no-flatten-grads"]])
def test_autocast_bf16_with_another_precision_flag(tmp_path, data_bin, other):
    """electra-train (fairseq-train with --bf16 usable) refuses two precision modes at once."""
    cmd = train_cmd(data_bin, tmp_path / "ck", "--max-update", "1", "--autocast-bf16", *other)
    cmd[1:3] = ["-m", "electra_plugin.cli.train"]
    assert_usage_error(cmd, "--autocast-bf16 does not combine", "keep --autocast-bf16")


@pytest.mark.slow
@pytest.mark.parametrize("entry, extra", [("fairseq_cli.train", ["--graphed-step"]),
                                          ("electra_plugin.cli.train", [])])
def test_fp16_on_the_cpu_is_one_line_and_writes_nothing(tmp_path, data_bin, entry, extra):
    """--cpu --fp16 (fairseq's FP16Optimizer asks for a CUDA device): the line that names what
    trains on the CPU instead, no traceback, nothing in the save directory."""
    cmd = train_cmd(data_bin, tmp_path / "ck", "--max-update", "1", "--fp16", *extra)
    cmd[2] = entry
    proc = run(cmd)  # forked from the warm server: its warnings may come first on stderr
    assert_one_line_error(proc, "--fp16 on the CPU", "--bf16", "--autocast-bf16", "fp32")
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())


# ---------------------------------------------------------------- resumes of another model


def without_sizes(cmd):
    """``train_cmd`` without its size options: the model is the --arch's size."""
    cmd = list(cmd)
    for option in ("--num-layers", "--hidden-size", "--num-heads", "--ffn-size",
                   "--embedding-size"):
        del cmd[cmd.index(option):cmd.index(option) + 2]
    return cmd


@pytest.mark.slow  # a 1-update run of electra_tiny's own size first: 1.2-1.8 s here
def test_resuming_with_another_arch_names_the_arch_not_the_dictionary(tmp_path, data_bin):
    save = tmp_path / "ck"
    train_in_process(without_sizes(train_cmd(data_bin, save, "--max-update", "1")))
    before = {p.name: digest(p) for p in save.glob("*.pt")}
    assert before
    line = assert_usage_error(
        without_sizes(train_cmd(data_bin, save, "--max-update", "2", arch="electra_small")),
        f"checkpoint {save / 'checkpoint_last.pt'} does not fit this model",
        "trained with --arch electra_tiny, --num-layers 4, --hidden-size 128, --ffn-size 512, "
        "--embedding-size 64 where this command gives --arch electra_small, --num-layers 12, "
        "--hidden-size 256, --ffn-size 1024, --embedding-size 128")
    assert "vocabulary" not in line and "dict.txt" not in line
    assert {p.name: digest(p) for p in save.glob("*.pt")} == before


@pytest.mark.parametrize("option, saved, given", [
    ("--num-heads", "4", "8"),  # the same shapes: loaded without a word before
    ("--objective", "electra", "electra_15"),  # the same shapes too
    ("--generator-size", "0.25", "0.5"),
    ("--generator", "masked_lm", "unigram"),
])
def test_resuming_with_another_model_setting_names_it(tmp_path, data_bin, tiny_checkpoint,
                                                      option, saved, given):
    save = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, save)
    before = {p.name: digest(p) for p in save.glob("*.pt")}
    cmd = train_cmd(data_bin, save, "--max-update", "3")
    if option in cmd:
        cmd[cmd.index(option) + 1] = given
    else:
        cmd += [option, given]
    line = assert_usage_error(cmd, "does not fit this model",
                              f"trained with {option} {saved} where this command gives "
                              f"{option} {given};")
    assert "vocabulary" not in line
    assert {p.name: digest(p) for p in save.glob("*.pt")} == before


def test_restoring_onto_data_of_another_dictionary_names_the_dictionary(tmp_path, data_bin,
                                                                         tiny_checkpoint):
    data = tmp_path / "data"
    shutil.copytree(data_bin, data)
    entries = len((data / "dict.txt").read_text().splitlines())
    with open(data / "dict.txt", "a") as f:
        f.write("zebra 1\n")
    # 4 special symbols and <mask> beside dict.txt's entries
    line = assert_usage_error(train_cmd(data, tmp_path / "ck", "--max-update", "2",
                                        "--restore-file", tiny_checkpoint / "checkpoint_last.pt"),
                              f"vocabulary has {entries + 5} entries but this data's "
                              f"dictionary gives {entries + 6}", "another dict.txt")
    assert "does not fit" not in line
    assert not list((tmp_path / "ck").glob("*.pt"))


def test_one_refusal_for_an_output_directory_that_holds_files(tmp_path, spm_data):
    """electra-prepare, electra-glue and electra-squad refuse the same way, name the same
    flag, and leave the user's file as it was (their mains, in process)."""
    from electra_plugin.cli import glue, prepare, squad as squad_cli
    from helpers import squad_json, write_json, write_rte

    write_corpus(tmp_path / "corpus.txt", 200, seed=1)
    squad = write_json(tmp_path / "squad.json", squad_json())
    outs = {name: tmp_path / name for name in ("prepare", "glue", "squad")}
    mine = {"prepare": "dict.txt", "glue": "notes.txt", "squad": "train.squad.json"}
    for name, out in outs.items():
        out.mkdir()
        (out / mine[name]).write_text("mine\n")
    commands = {
        "prepare": (prepare.main, ["--train", tmp_path / "corpus.txt", "--destdir",
                                   outs["prepare"], "--sentencepiece-vocab-size", "80"]),
        "glue": (glue.main, ["preprocess", "--task", "RTE", "--glue-dir",
                             write_rte(tmp_path / "RTE", 4, 4), "--pretrain-data", spm_data,
                             "--destdir", outs["glue"]]),
        "squad": (squad_cli.main, ["preprocess", "--pretrain-data", spm_data, "--train",
                                   squad, "--destdir", outs["squad"], "--max-seq-len", "64",
                                   "--doc-stride", "16", "--max-query-len", "16"])}
    for name, (main, argv) in commands.items():
        line = assert_main_error(main, argv)
        assert line == (f"electra_plugin: error: {outs[name]} already holds files "
                        f"({mine[name]}); choose an empty directory or pass --force to write "
                        f"over them"), line
        assert (outs[name] / mine[name]).read_text() == "mine\n"
