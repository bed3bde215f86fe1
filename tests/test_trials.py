"""Fine-tuning evaluated as the paper evaluates it: statistics of many runs, the trials
command (real fairseq-train runs of electra_tiny), GLUE test-set server files and
double_unordered."""

import contextlib
import json
import os
import random
import re
import signal
import statistics
import sys
import time

import pytest

from electra_plugin.cli import finetune as finetune_cli
from electra_plugin.cli import glue as glue_cli
from electra_plugin.data import glue
from electra_plugin.finetuning import statistics as st
from electra_plugin.finetuning import report
from electra_plugin.run.stop_signals import stopped_by_signals
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import assert_main_error, run, sentence, start, write_rte


# ----------------------------------------------------------------------- statistics

def test_summary_median_first_and_failed_runs_by_hand():
    # the README's old three runs: mean 65.50 +- 14.90 but median 73.67; one run at chance
    s = st.summarise([74.53, 48.30, 73.67], baseline=51.70)
    assert (s.n, s.median, s.min, s.max, s.failed) == (3, 73.67, 48.30, 74.53, 1)
    assert s.mean == pytest.approx(65.50, abs=0.005)
    assert s.std == pytest.approx(14.90, abs=0.005)
    # within FAILED_MARGIN (1 point) of the baseline counts as failed, above it does not
    assert st.summarise([52.69, 52.71], baseline=51.70).failed == 1
    assert st.summarise([60.0]).std == 0 and st.summarise([60.0]).failed == 0
    assert st.format_summary(s) == \
        "median 73.67 | mean 65.50 +- 14.90 | min 48.30 max 74.53 | 1 of 3 failed"


def test_paired_comparison_verdicts():
    ahead = st.compare_paired([75, 76, 74, 77, 75], [72, 73, 72, 74, 71], ("ELECTRA", "random"))
    # differences 3, 3, 2, 3, 4: every resample's mean lies in [2, 4]
    assert ahead.mean_difference == pytest.approx(3.0) and ahead.median_difference == 3.0
    assert 2 <= ahead.low <= ahead.high <= 4
    assert ahead.verdict.startswith("ELECTRA ahead of random by 3.00 points (95% interval")
    assert ahead.wilcoxon_p == pytest.approx(0.0625)  # the smallest p five pairs can give
    behind = st.compare_paired([70, 71, 69], [73, 74, 73], ("ELECTRA", "random"))
    assert behind.verdict.startswith("random ahead of ELECTRA by 3.33 points")
    mixed = st.compare_paired([74.53, 48.30, 73.67], [71.88, 73.39, 71.69])
    assert mixed.low < 0 < mixed.high
    assert mixed.verdict.startswith("no difference this budget can detect: A - B = -6.82")
    same = st.compare_paired([1.0, 2.0], [1.0, 2.0])
    assert same.wilcoxon_p is None and same.low == same.high == 0
    with pytest.raises(ValueError):
        st.compare_paired([1.0], [1.0, 2.0])


def test_constant_prediction_baselines_by_hand():
    mrpc = glue.get_task("MRPC")
    gold = [1, 1, 1, 0]  # all-1: F1 2*0.75/(1.75) = 85.71, accuracy 75
    base = glue.constant_baseline(mrpc, gold)
    assert base["f1"] == pytest.approx(100 * 6 / 7) and base["accuracy"] == 75.0
    assert glue.constant_baseline(glue.get_task("CoLA"), [0, 1, 1]) == {"mcc": 0.0}
    assert glue.constant_baseline(glue.get_task("STS-B"), [0.5, 4.0]) == \
        {"pearson": 0.0, "spearman": 0.0}
    mnli = glue.get_task("MNLI")
    assert glue.constant_baseline(mnli, [0, 2, 2, 1, 2])["accuracy"] == 60.0


def result(arm, task, seed, scores, baselines):
    return {"arm": arm, "task": task, "seed": seed, "scores": scores, "baselines": baselines}


def test_report_table_and_glue_score_by_hand(tmp_path):
    runs = [result("pre-trained", "RTE", s, {"RTE": {"accuracy": a}}, {"RTE": {"accuracy": 52.7}})
            for s, a in ((1, 60.0), (2, 53.0), (3, 66.0))]
    runs += [result("pre-trained", "MNLI", s, {"MNLI": {"accuracy": m}, "MNLI-mm": {"accuracy": mm}},
                    {"MNLI": {"accuracy": 35.4}, "MNLI-mm": {"accuracy": 35.2}})
             for s, m, mm in ((1, 70.0, 71.0), (2, 72.0, 70.0), (3, 74.0, 72.0))]
    runs += [result("pre-trained", "CoLA", s, {"CoLA": {"mcc": c}}, {"CoLA": {"mcc": 0.0}})
             for s, c in ((1, 0.5), (2, 20.0), (3, 30.0))]
    rows = report.report_rows(runs)
    table = report.markdown(rows, runs)
    lines = table.splitlines()
    assert lines[0] == "| arm | task | metric | runs | median | mean | std | min | max | failed |"
    # 53.0 is within a point of RTE's majority class (52.7): a failed run
    assert "| pre-trained | RTE | accuracy | 3 | 60.00 | 59.67 | 6.51 | 53.00 | 66.00 | 1 |" in lines
    assert "| pre-trained | MNLI | accuracy | 3 | 72.00 | 72.00 | 2.00 | 70.00 | 74.00 | 0 |" in lines
    assert "| pre-trained | MNLI-mm | accuracy | 3 | 71.00 | 71.00 | 1.00 | 70.00 | 72.00 | 0 |" in lines
    # CoLA's 0.5 MCC is within a point of 0: a failed run
    assert "| pre-trained | CoLA | mcc | 3 | 20.00 | 16.83 | 15.00 | 0.50 | 30.00 | 1 |" in lines
    # GLUE score: the mean of the task medians (MNLI matched, CoLA's MCC): (60 + 72 + 20) / 3
    assert report.glue_score(rows, "pre-trained") == (pytest.approx(152 / 3), 3)
    assert "pre-trained: GLUE score (mean of the medians over 3 tasks): 50.67" in table
    assert report.glue_score(report.report_rows(runs[:3]), "pre-trained") is None  # RTE alone
    # the suite's average: every dev split's judging metric, MNLI-mm too: (60+72+71+20) / 4
    assert report.suite_average(rows, "pre-trained") == (pytest.approx(55.75), 4)
    assert "pre-trained: average over 4 tasks of the medians: 55.75" in table
    json_path, md_path = report.write_report(rows, runs, str(tmp_path))
    saved = json.load(open(json_path))
    assert saved["glue_score"]["pre-trained"] == pytest.approx(152 / 3)
    assert saved["average"]["pre-trained"] == pytest.approx(55.75)
    assert {(r["task"], r["metric"]): r["median"] for r in saved["rows"]}[("RTE", "accuracy")] \
        == statistics.median([60.0, 53.0, 66.0])
    assert open(md_path).read() == table


def test_trials_usage_errors(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    assert_main_error(finetune_cli.main, ["trials", "--task", "RTE", "--arch", "electra_tiny",
                                          "--workdir", str(tmp_path / "w")],
                      "--task 'RTE' is not NAME=DIR")
    assert_main_error(finetune_cli.main, ["trials", "--task", "XNLI=" + str(data), "--arch",
                                          "electra_tiny", "--workdir", str(tmp_path / "w")],
                      "--task XNLI", "is empty", "electra-glue preprocess", "electra-squad")
    assert_main_error(finetune_cli.main, ["trials", "--task", f"RTE={data}", "--workdir",
                                          str(tmp_path / "w")],
                      "give --checkpoint CHECKPOINT or --arch ARCH")
    assert_main_error(finetune_cli.main, ["trials", "--task", f"RTE={data}", "--arch",
                                          "electra_tiny", "--seeds", "1", "1", "--workdir",
                                          str(tmp_path / "w")], "repeats a seed")
    assert_main_error(finetune_cli.main, ["trials", "--task", f"RTE={tmp_path / 'none'}",
                                          "--arch", "electra_tiny", "--workdir",
                                          str(tmp_path / "w")], "is not a directory")


# ------------------------------------------------------------------ real trials

TINY = "--num-layers 2 --hidden-size 64 --num-heads 4 --ffn-size 128 --embedding-size 32"


@pytest.fixture(scope="module")
def rte_data(tmp_path_factory, spm_data):
    root = tmp_path_factory.mktemp("trials")
    glue_cli.main(["preprocess", "--task", "RTE", "--glue-dir",
                   str(write_rte(root / "RTE", 24, 10)), "--pretrain-data", str(spm_data),
                   "--destdir", str(root / "bin")])
    return root / "bin"


@pytest.mark.slow
def test_trials_of_a_checkpoint_and_a_random_init(tmp_path, rte_data, pretrained, capsys,
                                                  monkeypatch):
    common = ["--task", f"RTE={rte_data}", "--seeds", "1", "2", "--max-update", "3",
              "--batch-size", "8", "--cpu", "--jobs", "2"]
    work = tmp_path / "pre"
    assert finetune_cli.main(["trials", "--checkpoint", str(pretrained), "--workdir", str(work),
                              *common]) == 0
    out = capsys.readouterr().out
    # each run's ordinary fairseq-train command is printed, from the checkpoint, one per seed
    commands = [line for line in out.splitlines() if line.startswith("$ ")]
    assert len(commands) == 2 and all("fairseq_cli.train" in c and "--finetune-from-model" in c
                                      and "--arch electra_tiny" in c for c in commands)
    assert {c.split("--seed ")[1].split()[0] for c in commands} == {"1", "2"}
    runs = [json.load(open(work / "RTE" / f"seed-{s}" / "result.json")) for s in (1, 2)]
    accuracies = [r["scores"]["RTE"]["accuracy"] for r in runs]
    assert all(0 <= a <= 100 for a in accuracies)
    # the dev set's majority class: RTE's labels as write_rte drew them
    gold = [row.split("\t")[-1] for row in (rte_data.parent / "RTE" / "dev.tsv")
            .read_text().splitlines()[1:]]
    majority = 100 * max(gold.count(label) for label in set(gold)) / len(gold)
    assert runs[0]["baselines"]["RTE"]["accuracy"] == pytest.approx(majority)
    saved = json.load(open(work / "trials.json"))
    row = saved["rows"][0]
    assert (row["arm"], row["task"], row["metric"], row["seeds"]) == \
        ("pre-trained", "RTE", "accuracy", [1, 2])
    assert row["median"] == pytest.approx(statistics.median(accuracies))
    assert row["failed"] == sum(a <= majority + 1 for a in accuracies)
    assert f"| pre-trained | RTE | accuracy | 2 | {statistics.median(accuracies):.2f} |" in \
        (work / "trials.md").read_text()

    # a re-run skips the finished trials and gives the same table
    before = (work / "trials.md").read_text()
    assert finetune_cli.main(["trials", "--checkpoint", str(pretrained), "--workdir", str(work),
                              *common]) == 0
    out = capsys.readouterr().out
    assert "$ " not in out and out.count("(done: pre-trained, RTE, seed") == 2
    assert (work / "trials.md").read_text() == before
    # the same directory with another recipe is refused, its results kept
    assert_main_error(finetune_cli.main, ["trials", "--checkpoint", str(pretrained),
                                          "--workdir", str(work), *common, "--lr", "1e-3"],
                      "holds a trial of another fine-tuning command")

    # random initialisation of the same size options, by --arch; each run's progress shown
    random_work = tmp_path / "random"
    monkeypatch.setenv("ELECTRA_PROGRESS_SECONDS", "0")
    assert finetune_cli.main(["trials", "--arch", "electra_tiny", f"--model-options={TINY}",
                              "--out-dir", str(random_work), "--fairseq-options=--log-interval 1",
                              *common[:-2]]) == 0
    out = capsys.readouterr().out
    assert re.search(r"random init, RTE, seed 1: update [123], loss \d", out), out[-3000:]
    commands = [line for line in out.splitlines() if line.startswith("$ ")]
    assert len(commands) == 2 and not any("--finetune-from-model" in c for c in commands)
    assert all("--num-layers 2" in c for c in commands)
    assert "random init, RTE accuracy over seeds [1, 2]: median" in out


@pytest.mark.slow
def test_squad_trials(tmp_path, spm_data, pretrained, capsys):
    from electra_plugin.cli import squad as squad_cli
    from helpers import squad_json, write_json

    path = write_json(tmp_path / "v2.json", squad_json("2.0"))
    data = tmp_path / "squad"
    squad_cli.main(["preprocess", "--pretrain-data", str(spm_data), "--train", str(path),
                    "--valid", str(path), "--destdir", str(data), "--max-seq-len", "64",
                    "--doc-stride", "16", "--max-query-len", "16"])
    assert finetune_cli.main(["trials", "--checkpoint", str(pretrained), "--task",
                              f"SQuAD={data}", "--seeds", "3", "--max-update", "2",
                              "--batch-size", "4", "--cpu", "--workdir", str(tmp_path / "w")]) == 0
    result = json.load(open(tmp_path / "w" / "SQuAD" / "seed-3" / "result.json"))
    assert set(result["scores"]["SQuAD"]) == {"exact", "f1"}
    # answering "" to all five questions gets the one unanswerable one right
    assert result["baselines"]["SQuAD"] == {"exact": 20.0, "f1": 20.0}
    assert "--task squad" in capsys.readouterr().out


# ------------------------------------------------- GLUE test sets, double_unordered

def write_mnli(root, n=12, seed=3):
    """MNLI's files: train/dev_matched/dev_mismatched labelled (sentences in columns 8, 9),
    the two test sets without labels, and the diagnostic set in GLUE's diagnostic/ folder."""
    rng = random.Random(seed)
    labels = ("contradiction", "entailment", "neutral")
    (root / "MNLI").mkdir(parents=True)
    head = "\t".join(["index", "promptID", "pairID", "genre", "b1", "b2", "p1", "p2",
                      "sentence1", "sentence2"])
    for split in ("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched"):
        labelled = not split.startswith("test")
        rows = [head + ("\tlabel1\tgold_label" if labelled else "")]
        for i in range(n):
            row = [f"{split[:4]}{i}", "p", "q", "fiction", "b", "b", "p", "p", sentence(rng),
                   sentence(rng)]
            rows.append("\t".join(row + ([rng.choice(labels)] * 2 if labelled else [])))
        (root / "MNLI" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    (root / "diagnostic").mkdir()
    (root / "diagnostic" / "diagnostic.tsv").write_text(
        "index\tsentence1\tsentence2\n" + "".join(
            f"{i}\t{sentence(rng)}\t{sentence(rng)}\n" for i in range(5)))
    return root / "MNLI"


@pytest.mark.slow
def test_glue_test_outputs_for_the_server(tmp_path, spm_data, pretrained):
    dest = tmp_path / "mnli-bin"
    glue_cli.main(["preprocess", "--task", "MNLI", "--glue-dir", str(write_mnli(tmp_path)),
                   "--pretrain-data", str(spm_data), "--destdir", str(dest)])
    spec = json.load(open(dest / "test_outputs.json"))
    assert spec["task"] == "MNLI"
    assert {k: v["server_file"] for k, v in spec["splits"].items()} == \
        {"test": "MNLI-m.tsv", "test1": "MNLI-mm.tsv", "test2": "AX.tsv"}
    assert spec["splits"]["test"]["ids"] == [f"test{i}" for i in range(12)]
    assert spec["splits"]["test2"]["ids"] == [str(i) for i in range(5)]
    assert not (dest / "label" / "test.bin").exists()  # no labels for the test sets

    save = tmp_path / "ft"
    finetune_cli.main(["trials", "--checkpoint", str(pretrained), "--task", f"MNLI={dest}",
                       "--seeds", "1", "--max-update", "2", "--batch-size", "4", "--cpu",
                       "--workdir", str(save)])
    ck = save / "MNLI" / "seed-1" / "checkpoint_last.pt"
    result = json.load(open(save / "MNLI" / "seed-1" / "result.json"))
    assert set(result["scores"]) == {"MNLI", "MNLI-mm"}  # matched and mismatched dev sets
    out = tmp_path / "submission"
    assert finetune_cli.main(["test-outputs", "--checkpoint", str(ck), "--data", str(dest),
                              "--out-dir", str(out), "--cpu"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    for name, ids in (("MNLI-m.tsv", [f"test{i}" for i in range(12)]),
                      ("MNLI-mm.tsv", [f"test{i}" for i in range(12)]),
                      ("AX.tsv", [str(i) for i in range(5)])):
        lines = (out / name).read_text().splitlines()
        assert lines[0] == "index\tprediction"
        rows = [line.split("\t") for line in lines[1:]]
        assert [r[0] for r in rows] == ids
        assert {r[1] for r in rows} <= {"contradiction", "entailment", "neutral"}
    # the same predictions as the model's on the binarized split
    from electra_plugin.finetuning.evaluate import sentence_predictions

    preds, gold = sentence_predictions(str(ck), str(dest), ["test1"], cpu=True)["test1"]
    assert gold is None
    labels = glue.get_task("MNLI").labels
    assert [labels[p] for p in preds] == \
        [line.split("\t")[1] for line in (out / "MNLI-mm.tsv").read_text().splitlines()[1:]]
    assert_main_error(glue_cli.main, ["evaluate", "--task", "MNLI", "--checkpoint", str(ck),
                                      "--data", str(dest), "--split", "test"],
                      "has no labels to score", "electra-finetune test-outputs")


def test_test_splits_read_their_own_columns(tmp_path):
    """SST-2's, CoLA's and QQP's test files put the sentences elsewhere than their training
    files (and CoLA's has a header its training file lacks)."""
    rng = random.Random(0)
    sst = tmp_path / "SST-2"
    sst.mkdir()
    (sst / "train.tsv").write_text("sentence\tlabel\n" + "".join(
        f"{sentence(rng)}\t{i % 2}\n" for i in range(8)))
    (sst / "dev.tsv").write_text("sentence\tlabel\nthe cat sees a house .\t1\n")
    (sst / "test.tsv").write_text("index\tsentence\n0\ta dog likes the ball .\n"
                                  "1\tthe river paints a quiet song .\n")
    sentences, labels = glue.read_split(glue.get_task("SST-2"), str(sst / "test.tsv"), False,
                                        glue.get_task("SST-2").test_splits[0])
    assert sentences == [("a dog likes the ball .",), ("the river paints a quiet song .",)]
    assert labels is None
    cola = glue.get_task("CoLA").test_splits[0]
    (tmp_path / "cola.tsv").write_text("id\tsentence\n7\tthe cat sees .\n")
    assert glue.read_split(glue.get_task("CoLA"), str(tmp_path / "cola.tsv"), False, cola) \
        == ([("the cat sees .",)], None)
    assert glue.read_ids(cola, str(tmp_path / "cola.tsv")) == ["7"]
    qqp = glue.get_task("QQP").test_splits[0]
    (tmp_path / "qqp.tsv").write_text("id\tquestion1\tquestion2\n5\twho ?\twhat ?\n")
    assert glue.read_split(glue.get_task("QQP"), str(tmp_path / "qqp.tsv"), False, qqp)[0] == \
        [("who ?", "what ?")]

@pytest.mark.slow
def test_double_unordered(tmp_path, spm_data):
    """MRPC and STS-B train on both orders of each pair (the official default); the dev set
    keeps one; --no-double-unordered turns it off, and single-sentence tasks refuse it."""
    rng = random.Random(1)
    mrpc = tmp_path / "MRPC"
    mrpc.mkdir()
    for split, n in (("train", 6), ("dev", 3)):
        (mrpc / f"{split}.tsv").write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "".join(
            f"{i % 2}\t{i}\t{i}\t{sentence(rng)}\t{sentence(rng)}\n" for i in range(n)))
    from fairseq.data import Dictionary, data_utils

    def read(dest, split, part):
        d = Dictionary.load(str(dest / part / "dict.txt"))
        data = data_utils.load_indexed_dataset(str(dest / part / split), d)
        return [d.string(data[i]) for i in range(len(data))]

    doubled, single = tmp_path / "doubled", tmp_path / "single"
    glue_cli.main(["preprocess", "--task", "MRPC", "--glue-dir", str(mrpc), "--pretrain-data",
                   str(spm_data), "--destdir", str(doubled)])
    glue_cli.main(["preprocess", "--task", "MRPC", "--glue-dir", str(mrpc), "--pretrain-data",
                   str(spm_data), "--destdir", str(single), "--no-double-unordered"])
    a, b = read(doubled, "train", "input0"), read(doubled, "train", "input1")
    assert len(a) == 12 and a[6:] == b[:6] and b[6:] == a[:6]  # the pairs, then swapped
    assert read(doubled, "train", "label") == read(doubled, "train", "label")[:6] * 2
    assert read(single, "train", "input0") == a[:6] and len(read(doubled, "valid", "input0")) == 3
    assert_main_error(glue_cli.main, ["preprocess", "--task", "SST-2", "--glue-dir", str(mrpc),
                                      "--pretrain-data", str(spm_data), "--destdir",
                                      str(tmp_path / "x"), "--double-unordered"],
                      "--double-unordered needs sentence pairs")


@pytest.mark.slow
def test_a_trial_forked_warm_is_the_trial_its_command_runs(tmp_path, rte_data, monkeypatch,
                                                           capsys):
    """Each trial starts from the fork server (speed/launch.py) or, with ELECTRA_SPEED=-launch,
    as the printed command in a new interpreter: the same log lines, the same scores, the
    same one-line failure."""
    common = ["--arch", "electra_tiny", "--task", f"RTE={rte_data}", "--seeds", "3",
              "--max-update", "3", "--batch-size", "8", "--cpu"]
    runs = {}
    for speed in ("1", "-launch"):
        monkeypatch.setenv("ELECTRA_SPEED", speed)
        work = tmp_path / speed
        assert finetune_cli.main(["trials", "--workdir", str(work), *common]) == 0
        log = (work / "RTE" / "seed-3" / "train.log").read_text()
        losses = re.findall(r"\| train_inner \|.*?loss ([\d.]+)|\| train \|.*?loss ([\d.]+)", log)
        runs[speed] = (json.load(open(work / "RTE" / "seed-3" / "result.json"))["scores"],
                       losses, "| INFO | fairseq_cli.train | done training" in log)
        with pytest.raises(ElectraUsageError) as failed:
            finetune_cli.main(["trials", "--workdir", str(tmp_path / f"bad{speed}"), *common,
                               "--fairseq-options=--no-such-option"])
        line = str(failed.value)
        assert "failed (exit 2): train.py: error: unrecognized arguments: " \
               "--no-such-option; its log: " in line, line
    capsys.readouterr()
    assert runs["1"] == runs["-launch"] and runs["1"][1] and runs["1"][2]


@pytest.mark.slow  # a fork server and a new interpreter: 3.7 s
def test_a_run_forked_warm_starts_its_children_as_its_command_does(tmp_path):
    """A run started from the fork server starts its own children (fairseq's loader workers)
    as a new interpreter of its command would, not from a fork server of its own, which
    imports fairseq again in every worker."""
    from electra_plugin.speed.launch import ForkedRun, start_fairseq_train

    log = tmp_path / "run.log"
    with open(log, "w") as out:
        forked = start_fairseq_train([sys.executable, "-m", "start_method_probe"], out,
                                     dict(os.environ))
    assert isinstance(forked, ForkedRun) and forked.wait(60) == 0, log.read_text()
    fresh = run([sys.executable, "-m", "start_method_probe"], fresh=True,
                cwd=os.path.dirname(__file__))  # (where -m finds it)
    assert fresh.returncode == 0 and log.read_text() == fresh.stdout, log.read_text()


# a caller's script without an ``if __name__ == "__main__"`` guard: it notes each run of its
# top level, then runs trials
UNGUARDED = """import sys
from electra_plugin.cli import finetune
with open(sys.argv[1], "a") as runs:
    runs.write("top level\\n")
finetune.main(["trials", *sys.argv[2:]])
"""


@pytest.mark.slow
def test_trials_from_a_script_without_a_main_guard(tmp_path, rte_data):
    """multiprocessing would run the caller's script again in each trial; the trials start
    from the fork server without it, so such a script runs once and its trials end well."""
    script, runs = tmp_path / "fine_tune.py", tmp_path / "runs.txt"
    script.write_text(UNGUARDED)
    result = run([sys.executable, script, runs, "--arch", "electra_tiny", "--task",
                  f"RTE={rte_data}", "--seeds", "1", "--max-update", "1", "--batch-size", "8",
                  "--cpu", "--out-dir", tmp_path / "out"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert runs.read_text() == "top level\n"
    assert (tmp_path / "out" / "RTE" / "seed-1" / "result.json").is_file()


def holders(paths):
    """The processes that hold one of ``paths`` open."""
    wanted, found = {str(p) for p in paths}, set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in wanted
                   for fd in os.listdir(f"/proc/{pid}/fd")):
                found.add(int(pid))
        except OSError:  # ended meanwhile, or not ours to read
            pass
    return found


def wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.mark.slow
def test_sigterm_ends_a_trials_command_and_its_trials(tmp_path, rte_data):
    """SIGTERM (timeout, kill, a scheduler) ends a trials command as it ends any process, and
    the trials it started end with it instead of training on alone."""
    out = tmp_path / "out"
    proc = start([sys.executable, "-m", "electra_plugin.cli.finetune", "trials", "--arch",
                  "electra_tiny", "--task", f"RTE={rte_data}", "--seeds", "1", "2", "--jobs", "2",
                  "--max-update", "100000", "--batch-size", "8", "--cpu", "--out-dir", out])
    logs = [out / "RTE" / f"seed-{seed}" / "train.log" for seed in (1, 2)]
    wait_for(lambda: all(log.is_file() and "Start iterating over samples" in log.read_text()
                         for log in logs), 120, "the trials did not start training")
    trials = holders(logs)
    assert len(trials) >= 2, trials  # each trial's process writes its log
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=60) == -signal.SIGTERM
        wait_for(lambda: not holders(logs), 30, f"trials still running: {holders(logs)}")
    finally:  # (not left training through the rest of the suite)
        for pid in holders(logs) | ({proc.pid} if proc.poll() is None else set()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_callers_own_sigterm_handler_is_left_as_it_is():
    """A Python caller that handles SIGTERM itself keeps its handler while trials run."""
    seen, hangup = [], signal.getsignal(signal.SIGHUP)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with stopped_by_signals():
            os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGHUP) == hangup  # as it was before
    finally:
        signal.signal(signal.SIGTERM, previous)
