"""What is checked before anything runs: the trials' counts and seeds, each task's name (once)
and data directory against the kind of data its fine-tuning reads and the dictionary the model
was pre-trained with, a checkpoint's kind against its use (trials, test-outputs, scoring:
before the data); and a preparation command that fails half-way leaves no directory it made,
and keeps one that was there."""

import json
import random
import resource
import shutil

import pytest

from electra_plugin.cli import choice as choice_cli
from electra_plugin.cli import extract as extract_cli
from electra_plugin.cli import finetune as finetune_cli
from electra_plugin.cli import glue as glue_cli
from electra_plugin.cli import score as score_cli
from electra_plugin.cli import squad as squad_cli
from electra_plugin.cli import tag as tag_cli
from electra_plugin.finetuning import scoring
from electra_plugin.finetuning import trials as tr
from electra_plugin.models.core.checkpoint import write_checkpoint
from electra_plugin.models.electra import ElectraModel
from electra_plugin.data.dictionary import load_dictionary
from electra_plugin.tasks.electra_pretraining import (ElectraPretrainingConfig,
                                                      ElectraPretrainingTask)
from helpers import (assert_main_error, assert_one_line_error, command, run, sentence,
                     squad_json, tiny_model, tiny_model_config, write_json, write_rte)

CONLL = "the DT O\ncat NN B-ANI\nsees VB O\na DT O\ndog NN B-ANI\n\nmy PR O\nneighbour NN B-PER\n"
GLUE_COMMAND = "make {0} data with electra-glue preprocess --task {0} --glue-dir GLUE_DIR/{0}"
SQUAD_COMMAND = "make SQuAD data with electra-squad preprocess --pretrain-data PRETRAIN_DATA"


def trials(task, data, workdir, *extra):
    """``electra-finetune trials`` argv of a random initialisation (no checkpoint to read)."""
    return ["trials", "--arch", "electra_tiny", "--task", f"{task}={data}", "--workdir",
            workdir, *extra]


@pytest.fixture(scope="module")
def made(tmp_path_factory, spm_data):
    """One directory of each kind the in-process preparation commands write, an empty one and
    SQuAD data without a dev split; with spm_data, electra-prepare's."""
    root = tmp_path_factory.mktemp("kinds")
    squad = write_json(root / "squad.json", squad_json("1.1"))
    windows = ["--max-seq-len", "64", "--doc-stride", "16", "--max-query-len", "16"]
    squad_cli.main(["preprocess", "--pretrain-data", str(spm_data), "--train", str(squad),
                    "--valid", str(squad), "--destdir", str(root / "squad"), *windows])
    squad_cli.main(["preprocess", "--pretrain-data", str(spm_data), "--train", str(squad),
                    "--destdir", str(root / "squad-train"), *windows])
    (root / "ner.conll").write_text(CONLL)
    tag_cli.main(["preprocess", "--pretrain-data", str(spm_data), "--train",
                  str(root / "ner.conll"), "--valid", str(root / "ner.conll"), "--destdir",
                  str(root / "ner")])
    (root / "mc.jsonl").write_text(json.dumps({"context": "a dog likes the ball .",
                                               "choices": ["the ball", "a house"],
                                               "label": 0}) + "\n")
    choice_cli.main(["preprocess", "--pretrain-data", str(spm_data), "--train",
                     str(root / "mc.jsonl"), "--valid", str(root / "mc.jsonl"), "--destdir",
                     str(root / "mc")])
    (root / "empty").mkdir()
    return {"pre-training": spm_data, **{name: root / name for name in
                                         ("squad", "squad-train", "ner", "mc", "empty")}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, spm_data):
    """Checkpoint files of each kind, written in process: pre-training (electra), its
    discriminator (electra-extract), pre-training without a generator or without a
    discriminator_head, and fine-tuned (sentence_prediction)."""
    root = tmp_path_factory.mktemp("checkpoints")
    electra = {"_name": "electra", "data": str(spm_data)}
    paths = {}
    for name, options in (("pre-training", {}), ("uniform generator", {"generator": "uniform"}),
                          ("mlm objective", {"objective": "mlm"})):
        model, task = tiny_model(**options)
        paths[name] = write_checkpoint(root / f"{name}.pt", tiny_model_config(**options),
                                       electra, model.state_dict())
    paths["discriminator"] = extract_cli.extract(paths["pre-training"], root / "disc.pt")
    model, task = tiny_model()
    finetuned = ElectraModel(model.cfg, task.dictionary, pretraining=False)
    paths["fine-tuned"] = write_checkpoint(
        root / "ft.pt", tiny_model_config(), {"_name": "sentence_prediction",
                                              "data": str(spm_data), "num_classes": 2},
        finetuned.state_dict(), criterion_cfg={"_name": "sentence_prediction"})
    return paths


# --------------------------------------------------------------------------- counts, seeds

@pytest.mark.parametrize("option, line", [
    (["--trials", "0"], "--trials 0 must be at least 1"),
    (["--jobs", "0"], "--jobs 0 must be at least 1"),
    (["--seeds", "2", "-1"], "--seeds -1: a seed is a whole number from 0 to 2147483647"),
    (["--seeds", "3", "3"], "--seeds 3 3 repeats a seed"),
    (["--batch-size", "0"], "--batch-size 0 must be at least 1"),
    (["--max-update", "0"], "--max-update 0 must be at least 1"),
    (["--epochs", "0"], "--epochs 0 must be more than 0"),
    (["--lr", "-1"], "--lr -1 must be more than 0"),
    (["--layer-decay", "0"], "--layer-decay 0 is not in (0, 1]"),
    (["--layer-decay", "1.5"], "--layer-decay 1.5 is not in (0, 1]"),
])
def test_counts_are_checked_first(tmp_path, option, line):
    """Before the checkpoint (which does not exist here) and the data, and nothing is written:
    --trials 0 used to end in a FileNotFoundError on trials.json.tmp."""
    work = tmp_path / "work"
    assert_main_error(finetune_cli.main, ["trials", "--checkpoint", tmp_path / "none.pt",
                                          "--task", f"RTE={tmp_path}", "--workdir", work,
                                          *option], line)
    assert not work.exists()


def test_seeds_given_override_the_trials_count(tmp_path):
    # --trials 0 with --seeds: the counts pass, and the next check (the checkpoint) speaks
    line = assert_main_error(finetune_cli.main, ["trials", "--checkpoint", tmp_path / "none.pt",
                                                 "--task", f"RTE={tmp_path}", "--workdir",
                                                 tmp_path / "w", "--trials", "0", "--seeds",
                                                 "4"], str(tmp_path / "none.pt"))
    assert "--trials" not in line


# -------------------------------------------------------------------------- data kinds

@pytest.mark.parametrize("task, kind, what", [
    ("RTE", "squad", "is SQuAD data (electra-squad preprocess), not RTE data"),
    ("SST-2", "ner", "is token tagging data (electra-tag preprocess), not SST-2 data"),
    ("MNLI", "mc", "is multiple-choice data (electra-choice preprocess), not MNLI data"),
    ("STS-B", "pre-training", "is pre-training data (electra-prepare), not STS-B data"),
    ("SQuAD", "ner", "is token tagging data (electra-tag preprocess), not SQuAD data"),
    ("SQuAD", "pre-training", "is pre-training data (electra-prepare), not SQuAD data"),
    ("SQuAD", "squad-train", "lacks valid.input.bin, valid.input.idx, valid.target.bin, "
                             "valid.target.idx ..."),
    ("RTE", "empty", "is empty"),
])
def test_each_task_s_data_is_checked_before_any_run(tmp_path, made, task, kind, what):
    """One line: the task, the directory, what it is instead (or lacks), and the command
    that makes the task's data; no run starts (the workdir is not even made)."""
    data, work = made[kind], tmp_path / "work"
    make = SQUAD_COMMAND if task == "SQuAD" else GLUE_COMMAND.format(task)
    assert_main_error(finetune_cli.main, trials(task, data, work, "--seeds", "1"),
                      f"--task {task}: {data} {what}; {make}")
    assert not work.exists()


def test_squad_data_passes_its_own_check(made):
    tr.check_data(tr.parse_task(f"SQuAD={made['squad']}"))  # no error: what the task reads


# ------------------------------------------------------------------- task names, dictionaries

def test_a_task_name_given_twice_is_refused_before_anything_is_written(tmp_path, made):
    """By --task twice, or by --task and a suite's entry: the runs of both would share
    OUT_DIR/NAME (the second resuming the first's), and the tables one row."""
    work = tmp_path / "work"
    ner, mc = made["ner"], made["mc"]
    twice = f"--task ner is given twice (ner={ner} and ner={mc}); its runs would share " \
            f"{work / 'ner'}: give each task once, under a name of its own (e.g. --task " \
            f"ner-2={mc})"
    assert_main_error(finetune_cli.main, ["trials", "--arch", "electra_tiny", "--task",
                                          f"ner={ner}", "--task", f"ner={mc}", "--seeds", "1",
                                          "--out-dir", work], twice)
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"tasks:\n  ner: {mc}\n")
    assert_main_error(finetune_cli.main, ["trials", "--arch", "electra_tiny", "--task",
                                          f"ner={ner}", "--suite", suite, "--seeds", "1",
                                          "--out-dir", work], twice)
    assert not work.exists()


@pytest.fixture(scope="module")
def own_checkpoint(tmp_path_factory, spm_data):
    """A pre-training checkpoint (written in process) of spm_data's dictionary."""
    task = ElectraPretrainingTask(ElectraPretrainingConfig(data=str(spm_data),
                                                           tokens_per_sample=32, seed=1),
                                  load_dictionary(str(spm_data)))
    model, _ = tiny_model(task)
    return write_checkpoint(tmp_path_factory.mktemp("own") / "ck.pt", tiny_model_config(),
                            {"_name": "electra", "data": str(spm_data)}, model.state_dict())


@pytest.fixture(scope="module")
def other_vocabulary(tmp_path_factory, spm_data):
    """spm_data with two entries of its dict.txt swapped, what a vocabulary of the same size
    and other ids is (and tagging data, dict.txt at the top, and multiple-choice data,
    input0/dict.txt, binarized with it): nothing else tells it from the checkpoint's."""
    root = tmp_path_factory.mktemp("other")
    shutil.copytree(spm_data, root / "bin")
    lines = (root / "bin" / "dict.txt").read_text().splitlines(keepends=True)
    lines[10], lines[11] = lines[11], lines[10]
    (root / "bin" / "dict.txt").write_text("".join(lines))
    (root / "ner.conll").write_text(CONLL)
    tag_cli.main(["preprocess", "--pretrain-data", str(root / "bin"), "--train",
                  str(root / "ner.conll"), "--valid", str(root / "ner.conll"), "--out-dir",
                  str(root / "ner")])
    (root / "mc.jsonl").write_text(json.dumps({"context": "a dog likes the ball .",
                                               "choices": ["the ball", "a house"],
                                               "label": 0}) + "\n")
    choice_cli.main(["preprocess", "--pretrain-data", str(root / "bin"), "--train",
                     str(root / "mc.jsonl"), "--valid", str(root / "mc.jsonl"), "--out-dir",
                     str(root / "mc")])
    return {"pre-training": root / "bin", "ner": root / "ner", "mc": root / "mc",
            "conll": root / "ner.conll"}


@pytest.mark.parametrize("kind, dictionary, making", [
    ("ner", "dict.txt", "electra-tag preprocess --pretrain-data {} --train TRAIN.conll"),
    ("mc", "input0/dict.txt", "electra-choice preprocess --pretrain-data {} --train TRAIN"),
])
def test_task_data_of_another_dictionary_than_the_checkpoint_s_is_refused(
        tmp_path, spm_data, made, own_checkpoint, other_vocabulary, kind, dictionary, making):
    """Where the kind keeps its dictionary; nothing is written. The same task's data of the
    checkpoint's dictionary passes, from the checkpoint or from its extracted discriminator."""
    data, work = other_vocabulary[kind], tmp_path / "work"
    assert_main_error(finetune_cli.main, ["trials", "--checkpoint", own_checkpoint, "--task",
                                          f"{kind}={data}", "--seeds", "1", "--out-dir", work],
                      f"--task {kind}: {data / dictionary} is not the dictionary the checkpoint "
                      f"was pre-trained with, {spm_data / 'dict.txt'} (",
                      f"): its data was binarized with another dictionary; make {kind} data "
                      f"again from the checkpoint's pre-training data: "
                      f"{making.format(spm_data)}")
    assert not work.exists()
    discriminator = extract_cli.extract(own_checkpoint, tmp_path / "disc.pt")
    for start in (own_checkpoint, discriminator):
        tr.check_dictionaries([tr.parse_task(f"{kind}={made[kind]}")], tr.from_checkpoint(start))


def test_a_dictionary_of_another_size_than_the_checkpoint_s_embeddings(tmp_path, made,
                                                                       checkpoints):
    """Where the checkpoint's pre-training data is not here (or its dict.txt changed since),
    the entries cannot be compared, the count can: the checkpoint's embedding rows."""
    model, _ = tiny_model()  # 60 entries
    gone = tmp_path / "moved-away"
    moved = write_checkpoint(tmp_path / "moved.pt", tiny_model_config(),
                             {"_name": "electra", "data": str(gone)}, model.state_dict())
    entries = len(load_dictionary(str(made["ner"])))
    work = tmp_path / "work"
    for checkpoint, why in ((moved, f"its pre-training data, {gone}, is not here to compare "
                                    f"the entries"),
                            (checkpoints["pre-training"],
                             f"{made['pre-training'] / 'dict.txt'} has {entries} now")):
        assert_main_error(finetune_cli.main, ["trials", "--checkpoint", checkpoint, "--task",
                                              f"ner={made['ner']}", "--out-dir", work],
                          f"--task ner: {made['ner'] / 'dict.txt'} gives {entries} entries "
                          f"with <mask> but the checkpoint's vocabulary has 60 ({why}): its "
                          f"data was binarized with another dictionary")
    assert not work.exists()


def test_a_random_init_arm_s_tasks_share_one_dictionary(tmp_path, made, other_vocabulary):
    work = tmp_path / "work"
    assert_main_error(finetune_cli.main, ["trials", "--arch", "electra_tiny", "--task",
                                          f"ner={made['ner']}", "--task",
                                          f"mc={other_vocabulary['mc']}", "--seeds", "1",
                                          "--out-dir", work],
                      f"--task mc: {other_vocabulary['mc'] / 'input0' / 'dict.txt'} is not the "
                      f"dictionary of --task ner, {made['ner'] / 'dict.txt'} (",
                      "one arm's tasks are binarized with one pre-training data's dictionary; "
                      "make mc data again with the --pretrain-data ner's was made with")
    assert not work.exists()
    tr.plan([tr.parse_task(f"ner={made['ner']}"), tr.parse_task(f"mc={made['mc']}")],
            tr.random_init(["--arch", "electra_tiny"]), [1], str(work))  # one dictionary
    assert not work.exists()


def test_tagging_in_one_command_refuses_another_pretrain_data_before_writing(
        tmp_path, spm_data, own_checkpoint, other_vocabulary):
    other, out = other_vocabulary["pre-training"], tmp_path / "run"
    assert_main_error(tag_cli.main, ["finetune", "--checkpoint", own_checkpoint, "--train",
                                     other_vocabulary["conll"], "--valid",
                                     other_vocabulary["conll"], "--out-dir", out,
                                     "--pretrain-data", other, "--cpu"],
                      f"--pretrain-data {other}: {other / 'dict.txt'} is not the dictionary "
                      f"the checkpoint was pre-trained with, {spm_data / 'dict.txt'} (",
                      f"); give the checkpoint's pre-training data, or leave --pretrain-data "
                      f"out to read it from the checkpoint ({spm_data})")
    assert not out.exists()


# ----------------------------------------------------------------------- checkpoint kinds

def test_trials_start_from_a_pre_training_checkpoint_or_its_discriminator(tmp_path, made,
                                                                         checkpoints):
    for kind in ("pre-training", "discriminator"):
        assert tr.from_checkpoint(checkpoints[kind]).arch == "electra_tiny"
    work = tmp_path / "work"
    assert_main_error(finetune_cli.main, ["trials", "--checkpoint", checkpoints["fine-tuned"],
                                          "--task", f"SQuAD={made['squad']}", "--workdir",
                                          work],
                      f"--checkpoint {checkpoints['fine-tuned']} is a checkpoint fine-tuned "
                      f"with --task sentence_prediction; trials fine-tune a pre-training "
                      f"checkpoint (task electra) or its discriminator (electra-extract)")
    assert not work.exists()


def test_test_outputs_checks_the_checkpoint_before_the_data(tmp_path, checkpoints):
    out = tmp_path / "out"
    for kind, what in (("pre-training", "a pre-training checkpoint (task electra)"),
                       ("discriminator", "a discriminator alone (task masked_lm")):
        assert_main_error(finetune_cli.main, ["test-outputs", "--checkpoint", checkpoints[kind],
                                              "--data", tmp_path / "none", "--out-dir", out],
                          f"--checkpoint {checkpoints[kind]} is {what}",
                          "test-outputs needs one fine-tuned on the task (a trial's "
                          "checkpoint_last.pt: --task sentence_prediction or token_tagging")
    assert not out.exists()


@pytest.mark.parametrize("main, command", [
    (glue_cli.main, ["evaluate", "--task", "RTE"]), (tag_cli.main, ["predict"]),
    (squad_cli.main, ["predict", "--out-dir", "out"]), (choice_cli.main, ["evaluate"])])
def test_evaluations_check_the_checkpoint_before_the_data(tmp_path, spm_data, checkpoints,
                                                          main, command):
    """A pre-training checkpoint, or a discriminator imported alone, is named as what it is,
    not reported as the data's missing dict.txt (or a traceback from fairseq's task)."""
    task = {glue_cli.main: "sentence_prediction", tag_cli.main: "token_tagging",
            squad_cli.main: "squad", choice_cli.main: "sentence_ranking"}[main]
    for kind, what in (("pre-training", "a pre-training checkpoint (task electra)"),
                       ("discriminator", "a discriminator alone (task masked_lm")):
        line = assert_main_error(main, [*command, "--checkpoint", checkpoints[kind], "--data",
                                        spm_data, "--cpu"],
                                 f"--checkpoint {checkpoints[kind]} is {what}",
                                 f"this needs one fine-tuned with --task {task} (a trial's "
                                 f"checkpoint_last.pt)")
        assert str(spm_data) not in line


@pytest.mark.parametrize("scorer, kind, what", [
    ("mlm", "fine-tuned", "is a checkpoint fine-tuned with --task sentence_prediction; "
                          "--scorer mlm needs a pre-training checkpoint (task electra)"),
    ("electric", "discriminator", "is a discriminator alone (task masked_lm: electra-extract, "
                                  "electra-convert import); --scorer electric needs a "
                                  "pre-training checkpoint (task electra)"),
    ("mlm", "uniform generator", "holds no masked LM; --scorer mlm needs a masked LM"),
    ("electric", "mlm objective", "holds no discriminator_head; --scorer electric reads"),
])
def test_scoring_checks_the_checkpoint_before_the_data(tmp_path, spm_data, checkpoints,
                                                       scorer, kind, what):
    """The pre-training data (no labels.txt, no input0/) is not blamed for a checkpoint of
    the wrong kind."""
    text = tmp_path / "hyps.txt"
    text.write_text("the cat sees a house .\n")
    line = assert_main_error(score_cli.main, ["score", "--checkpoint", checkpoints[kind],
                                              "--data", spm_data, "--input", text, "--scorer",
                                              scorer, "--cpu"],
                             f"--checkpoint {checkpoints[kind]} {what}")
    assert str(spm_data) not in line


def test_scorers_accept_the_checkpoints_that_have_their_part(checkpoints):
    for scorer in scoring.SCORERS:  # the generator and the discriminator_head
        scoring.check_checkpoint(checkpoints["pre-training"], scorer)
    scoring.check_checkpoint(checkpoints["mlm objective"], "mlm")  # its mlm_head
    scoring.check_checkpoint(checkpoints["uniform generator"], "electric")


# ------------------------------------------------------- preparation that fails half-way

def test_tagging_preprocess_that_fails_half_way_removes_the_directory_it_made(tmp_path,
                                                                             spm_data):
    """The dev file's unknown label stops the run after the training split was written."""
    (tmp_path / "train.conll").write_text(CONLL)
    (tmp_path / "dev.conll").write_text("the DT O\ncat NN B-XYZ\n")
    argv = ["preprocess", "--pretrain-data", spm_data, "--train", tmp_path / "train.conll",
            "--valid", tmp_path / "dev.conll"]
    dest = tmp_path / "ner"
    assert_main_error(tag_cli.main, [*argv, "--destdir", dest], "label 'B-XYZ' is not among")
    assert not dest.exists()
    # a directory that was there stays, with what it held; only this run's files go
    dest.mkdir()
    (dest / "notes.txt").write_text("the user's own file\n")
    assert_main_error(tag_cli.main, [*argv, "--destdir", dest, "--force"],
                      "label 'B-XYZ' is not among")
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]
    assert (dest / "notes.txt").read_text() == "the user's own file\n"


@pytest.mark.slow  # a real command under a file-size limit
def test_choice_preprocess_that_fails_half_way_removes_the_directory_it_made(tmp_path,
                                                                            spm_data):
    """A file-size limit (``ulimit -f``) stops the run while it writes the options, after it
    made the directory and its input folders."""
    rng = random.Random(0)
    (tmp_path / "train.jsonl").write_text("".join(
        json.dumps({"context": sentence(rng), "choices": [sentence(rng), sentence(rng)],
                    "label": rng.randrange(2)}) + "\n" for _ in range(200)))
    dest = tmp_path / "mc"

    proc = run(command("choice", "preprocess", "--pretrain-data", spm_data, "--train",
                       tmp_path / "train.jsonl", "--destdir", dest),
               limits={resource.RLIMIT_FSIZE: 2_000})
    assert_one_line_error(proc, f"cannot write into {dest} (File too large)")
    assert not dest.exists()


# ----------------------------------------------------------------- GLUE data, test outputs

def write_stsb(root, n_train=12, n_dev=6, seed=0):
    """STS-B's layout: the sentences in columns 7 and 8, the similarity score last."""
    rng = random.Random(seed)
    root.mkdir(parents=True)
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    for split, n in (("train", n_train), ("dev", n_dev)):
        rows = [f"{i}\tmain\tf\t2012\t{i}\tnone\tnone\t{sentence(rng)}\t{sentence(rng)}\t"
                f"{rng.uniform(0, 5):.2f}" for i in range(n)]
        (root / f"{split}.tsv").write_text("\n".join([head, *rows]) + "\n")
    return root


@pytest.mark.slow  # electra-glue preprocess runs fairseq-preprocess
def test_glue_data_against_the_task_and_the_fine_tuned_checkpoint(tmp_path, spm_data,
                                                                  checkpoints):
    rte = write_rte(tmp_path / "RTE", 16, 8)
    (rte / "test.tsv").write_text("index\tsentence1\tsentence2\n0\tthe cat sees a house .\t"
                                  "the cat sees it .\n")
    data = {"RTE": tmp_path / "rte-bin", "STS-B": tmp_path / "sts-bin"}
    for task, glue_dir in (("RTE", rte), ("STS-B", write_stsb(tmp_path / "STS-B"))):
        glue_cli.main(["preprocess", "--task", task, "--glue-dir", str(glue_dir),
                       "--pretrain-data", str(spm_data), "--destdir", str(data[task])])
        tr.check_data(tr.parse_task(f"{task}={data[task]}"))  # what each was made for passes
    work = tmp_path / "work"
    for task, kind, what in (
            ("SST-2", "RTE", "is QNLI or RTE data (electra-glue preprocess), not SST-2 data"),
            ("STS-B", "RTE", "is QNLI or RTE data (electra-glue preprocess), not STS-B data"),
            ("RTE", "STS-B", "is STS-B data (electra-glue preprocess), not RTE data"),
            ("MNLI", "RTE", "is QNLI or RTE data (electra-glue preprocess), not MNLI data")):
        assert_main_error(finetune_cli.main, trials(task, data[kind], work),
                          f"--task {task}: {data[kind]} {what}; {GLUE_COMMAND.format(task)}")
    unlabelled = tmp_path / "no-label"
    shutil.copytree(data["RTE"], unlabelled)
    shutil.rmtree(unlabelled / "label")
    assert_main_error(finetune_cli.main, trials("RTE", unlabelled, work),
                      f"--task RTE: {unlabelled} lacks label/; {GLUE_COMMAND.format('RTE')}")
    assert not work.exists()

    # test-outputs: a checkpoint fine-tuned for what the task's server file holds
    model, task = tiny_model()
    weights = ElectraModel(model.cfg, task.dictionary, pretraining=False).state_dict()
    out = tmp_path / "out"
    for name, fields, predicts in (("sts", {"regression_target": True, "num_classes": 1},
                                    "a score (--regression-target)"),
                                   ("mnli", {"num_classes": 3}, "3 classes")):
        path = write_checkpoint(tmp_path / f"{name}.pt", tiny_model_config(),
                                {"_name": "sentence_prediction", "data": str(spm_data),
                                 **fields}, weights,
                                criterion_cfg={"_name": "sentence_prediction"})
        assert_main_error(finetune_cli.main, ["test-outputs", "--checkpoint", path, "--data",
                                              data["RTE"], "--out-dir", out],
                          f"--checkpoint {path} predicts {predicts}; RTE needs 2 classes: give "
                          f"a checkpoint fine-tuned on RTE")
    assert not out.exists()
