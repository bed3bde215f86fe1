"""Fine-tuning kinds as registered units: the registry's contract for every kind, the task
files the preparation commands write, suites, the report, each kind's dev metric in fairseq's
validation (by hand and through fairseq-train), trials over every kind, NER in one command,
and a kind of one's own from a --user-dir module."""

import json
import random
import re
import sys
from pathlib import Path

import pytest
from fairseq.logging import metrics

from helpers import (NER, REPO, assert_one_line_error, assert_usage_line, command, failure,
                     prepared_suite, run, sentence, squad_json)
from electra_plugin.cli import finetune as finetune_cli
from electra_plugin.cli import glue as glue_cli
from electra_plugin.criterions.sentence import SentenceMetricsCriterion
from electra_plugin.criterions.tagging import TaggingCriterion
from electra_plugin.data import conll
from electra_plugin.finetuning import report
from electra_plugin.finetuning.kinds import (KINDS, TASK_FILE, PreparedTask, hf_heads,
                                             read_task_file, write_task_file)
from electra_plugin.finetuning.suite import read_suite
from electra_plugin.user_io.errors import ElectraUsageError

USER_KINDS = REPO / "tests" / "user_kinds"


# ------------------------------------------------------------------------- the registry

def test_every_registered_kind_is_whole():
    """Each kind names a fairseq task and criterion that are registered, a command that makes
    its data, and (when it has one) a transformers head every body family serves."""
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    from electra_plugin.convert.families import FAMILIES
    from electra_plugin.convert.keys import head_kinds

    assert list(KINDS) == ["sentence", "tagging", "squad", "choice"]
    for kind in KINDS.values():
        assert kind.fairseq_task in TASK_REGISTRY and kind.criterion in CRITERION_REGISTRY
        assert kind.prepare.startswith("electra-") and kind.title and kind.epochs > 0
        if kind.hf_head is not None:
            assert kind.hf_head.task == kind.fairseq_task
            for family in FAMILIES.values():
                assert {row.component for row in family.rows} >= {kind.hf_head.component}
    assert head_kinds() == hf_heads() == [k.hf_head for k in KINDS.values()]


def test_task_file_round_trip_and_damage(tmp_path):
    task = PreparedTask("tagging", "ner", ("f1", "accuracy"), ("O", "B-PER"),
                        {"train": 3, "valid": 2}, {"note": 1})
    write_task_file(tmp_path, task)
    back = read_task_file(tmp_path)
    assert back == PreparedTask(**{**task.__dict__, "directory": str(tmp_path)})
    assert back.metric == "f1"
    assert read_task_file(tmp_path / "nowhere") is None
    (tmp_path / TASK_FILE).write_text('{"kind": "tagging"}')
    with pytest.raises(ElectraUsageError) as caught:
        read_task_file(tmp_path)
    assert_usage_line(caught.value, f"{tmp_path / TASK_FILE} is not a task file",
                      "prepare the data again")


# ------------------------------------------------------------------------------- suites

def test_suite_file(tmp_path):
    (tmp_path / "suite.yaml").write_text(
        "tasks:\n  NSMC: data/nsmc\n  NER:\n    data: /abs/ner\n    epochs: 5\n"
        "    batch_size: 16\n")
    assert read_suite(str(tmp_path / "suite.yaml")) == [
        ("NSMC", str(tmp_path / "data" / "nsmc"), {}),
        ("NER", "/abs/ner", {"epochs": 5.0, "batch_size": 16})]
    for text, phrase in (
            ("tasks: [a, b]\n", "has no 'tasks:' mapping"),
            ("tasks:\n  NER: {epochs: 3}\n", "task NER needs a data directory"),
            ("tasks:\n  NER: {data: d, dropout: 0.2}\n", "task NER sets dropout; a task may "
                                                          "change lr, layer_decay"),
            ("tasks:\n  NER: {data: d, lr: fast}\n", "task NER: lr 'fast' is not a number"),
            ("tasks: {a: [\n", "is not YAML")):
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(ElectraUsageError) as caught:
            read_suite(str(tmp_path / "bad.yaml"))
        assert_usage_line(caught.value, "--suite", phrase)


# ------------------------------------------------------------------------------- report

def tagging_result(seed, f1, per_type):
    return {"arm": "pre-trained", "task": "ner", "seed": seed, "metric": "f1",
            "scores": {"ner": {"f1": f1, "accuracy": 90.0}},
            "baselines": {"ner": {"f1": 0.0, "accuracy": 80.0}},
            "details": {"ner": {"per_type": per_type}}}


def test_report_per_type_and_the_picture(tmp_path):
    runs = [tagging_result(s, f, {"PER": {"precision": p, "recall": 50.0, "f1": f,
                                          "support": 4}})
            for s, f, p in ((1, 60.0, 70.0), (2, 40.0, 30.0), (3, 50.0, 90.0))]
    rows = report.report_rows(runs)
    assert [(r.metric, r.judges) for r in rows] == [("f1", True), ("accuracy", False)]
    assert report.per_type(runs) == {("pre-trained", "ner"): {
        "PER": {"precision": 70.0, "recall": 50.0, "f1": 50.0}}}
    table = report.markdown(rows, runs)
    assert "| pre-trained | ner | f1 | 3 | 50.00 | 50.00 | 10.00 | 40.00 | 60.00 | 0 |" in table
    assert "| pre-trained | ner | PER | 70.00 | 50.00 | 50.00 |" in table
    paths = report.write_report(rows, runs, str(tmp_path), picture=True)
    assert Path(paths[2]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(Path(paths[0]).read_text())["average"] == {"pre-trained": 50.0}


# ------------------------------------------------- dev metrics in fairseq's validation, by hand

def derived(reduce, logging_outputs):
    with metrics.aggregate(new_root=True) as agg:
        reduce(logging_outputs)
        return agg.get_smoothed_values()


def test_sentence_dev_metrics_by_hand():
    """F1 of class 1 and MCC from every batch's (prediction, gold) pairs: tp 2, fp 1, fn 1,
    tn 1 -> F1 2/3, MCC (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6; a score's Pearson and Spearman."""
    logs = [{"loss": 1.0, "ntokens": 9, "nsentences": 3, "sample_size": 3, "ncorrect": 1,
             "_sentence_pairs": [(1, 1), (0, 1), (1, 0)], "regression": False, "classes": 2},
            {"loss": 1.0, "ntokens": 9, "nsentences": 2, "sample_size": 2, "ncorrect": 2,
             "_sentence_pairs": [(1, 1), (0, 0)], "regression": False, "classes": 2}]
    found = derived(SentenceMetricsCriterion.reduce_metrics, logs)
    assert found["f1"] == pytest.approx(66.67) and found["mcc"] == pytest.approx(16.67)
    assert found["accuracy"] == 60.0
    logs = [{"loss": 1.0, "ntokens": 4, "nsentences": 4, "sample_size": 4, "regression": True,
             "_sentence_pairs": [(1.0, 1.0), (2.0, 3.0), (3.0, 2.0), (4.0, 4.0)],
             "classes": 1}]
    found = derived(SentenceMetricsCriterion.reduce_metrics, logs)
    # x 1 2 3 4, y 1 3 2 4: r = 8 / 10 (deviations -1.5 -0.5 0.5 1.5 and -1.5 0.5 -0.5 1.5)
    assert found["pearson"] == pytest.approx(80.0) and found["spearman"] == pytest.approx(80.0)


def test_tagging_dev_metrics_by_hand():
    """Entity F1 over the sentences of every batch: gold PER, LOC; predicted PER, ORG ->
    precision 1/2, recall 1/2."""
    logs = [{"loss": 1.0, "words": 4, "correct": 3, "ntokens": 6, "nsentences": 1,
             "sample_size": 4,
             "_tagged_sentences": [(["B-PER", "I-PER", "O", "B-LOC"],
                                    ["B-PER", "I-PER", "O", "B-ORG"])]}]
    found = derived(TaggingCriterion.reduce_metrics, logs)
    assert (found["f1"], found["precision"], found["recall"]) == (50.0, 50.0, 50.0)
    assert found["accuracy"] == 75.0
    pos = [{**logs[0], "_tagged_sentences": [(["DT", "NN"], ["DT", "VB"])]}]
    assert "f1" not in derived(TaggingCriterion.reduce_metrics, pos)  # tags, not entities


def test_conll_files_as_people_have_them(tmp_path):
    """Tabs or spaces between the columns, the label last, Windows line ends, -DOCSTART-."""
    text = ("-DOCSTART- -X- -X- O\r\n\r\nEU\tNNP\tB-NP\tB-ORG\r\nrejects VBZ B-VP O\r\n\r\n"
            "Peter  NNP B-NP   B-PER\r\n")
    (tmp_path / "a.conll").write_bytes(text.encode())
    assert conll.read_conll(str(tmp_path / "a.conll")) == [
        conll.Sentence(["EU", "rejects"], ["B-ORG", "O"]), conll.Sentence(["Peter"], ["B-PER"])]


# ------------------------------------------------------- every kind through trials, for real

@pytest.mark.slow
def test_every_kind_through_trials_by_its_dev_metric(tmp_path, spm_data):
    """One suite file, every kind, the best model on dev by each task's own metric, which
    fairseq's validation logged and the trial's evaluation reproduces."""
    suite = prepared_suite(tmp_path, spm_data)
    records = {name: read_task_file(tmp_path / d) for name, d in
               (("opinions", "own-bin"), ("ner", "ner-bin"), ("squad", "squad-bin"),
                ("choice", "mc-bin"))}
    assert {n: (r.kind, r.metric) for n, r in records.items()} == {
        "opinions": ("sentence", "accuracy"), "ner": ("tagging", "f1"),
        "squad": ("squad", "f1"), "choice": ("choice", "accuracy")}
    assert records["opinions"].labels == ("neg", "pos")
    assert records["ner"].counts == {"train": 12, "valid": 12}
    work = tmp_path / "work"
    proc = run(command("finetune", "trials", "--arch", "electra_tiny", "--suite", suite,
                       "--trials", "1", "--keep", "best", "--max-update", "4", "--cpu",
                       "--picture", "--out-dir", work))
    assert proc.returncode == 0, failure("electra-finetune trials", proc)
    saved = json.loads((work / "trials.json").read_text())
    runs = {r["task"]: r for r in saved["runs"]}
    assert {t: (r["kind"], r["metric"], r["arm"]) for t, r in runs.items()} == {
        t: (records[t].kind, records[t].metric, "random init (best on dev)") for t in records}
    assert "--batch-size 4" in " ".join(runs["ner"]["command"])  # the suite's override
    assert set(runs["ner"]["details"]["ner"]["per_type"]) <= {"ANI", "PER"}
    for task, logged in (("opinions", ("accuracy", "f1", "mcc")),
                         ("ner", ("f1", "precision", "recall")), ("squad", ("exact", "f1")),
                         ("choice", ("accuracy",))):
        log = (work / task / "seed-1" / "train.log").read_text()
        valid = [line for line in log.splitlines() if "valid on 'valid' subset" in line]
        assert valid and all(f"| {m} " in valid[-1] for m in logged), valid
        metric = records[task].metric
        best = max(float(re.search(rf"\| {metric} ([\d.]+)", line).group(1)) for line in valid)
        # the kept model is the best by the logged metric, and evaluating it gives that value
        assert runs[task]["scores"][task][metric] == pytest.approx(best, abs=0.051)
    table = (work / "trials.md").read_text()
    assert "random init (best on dev): average over 4 tasks of the medians" in table
    assert (work / "trials.png").stat().st_size > 0

    # each kind writes its test split's predictions as its benchmark reads them
    written = {}
    for task, data in (("ner", "ner-bin"), ("squad", "squad-bin"), ("choice", "mc-bin")):
        out = tmp_path / "test-outputs" / task
        finetune_cli.main(["test-outputs", "--checkpoint",
                           str(work / task / "seed-1" / "checkpoint_best.pt"), "--data",
                           str(tmp_path / data), "--out-dir", str(out)])
        written[task] = sorted(p.name for p in out.iterdir())
    assert written == {"ner": ["test.conll"], "squad": ["predictions.json"],
                       "choice": ["test.choices"]}
    tagged = (tmp_path / "test-outputs" / "ner" / "test.conll").read_text().split("\n\n")
    assert [[line.split()[0] for line in s.splitlines()] for s in tagged if s.strip()] == \
        [["a", "dog"], ["my", "cat"]]
    answers = json.loads((tmp_path / "test-outputs" / "squad" / "predictions.json").read_text())
    assert sorted(answers) == sorted(q["id"] for a in squad_json("1.1")["data"]
                                     for p in a["paragraphs"] for q in p["qas"])
    chosen = (tmp_path / "test-outputs" / "choice" / "test.choices").read_text().split()
    assert len(chosen) == 12 and set(chosen) <= {"0", "1"}


@pytest.mark.slow
def test_ner_in_one_command(tmp_path, pretrained):
    """CoNLL files (tabs, Windows line ends, -DOCSTART-) to a dev F1 in one command, with the
    official recipe's options; the dev F1 is the predict command's on the same model."""
    text = "-DOCSTART- -X- O\n\n" + (NER.replace(" ", "\t") + "\n") * 6
    (tmp_path / "train.conll").write_bytes(text.replace("\n", "\r\n").encode())
    (tmp_path / "dev.conll").write_text(NER)
    out = tmp_path / "run"
    argv = ["finetune", "--checkpoint", pretrained, "--train", tmp_path / "train.conll",
            "--valid", tmp_path / "dev.conll", "--out-dir", out, "--cpu", "--json"]
    proc = run(command("tag", *argv))
    assert proc.returncode == 0, failure("electra-tag finetune", proc)
    printed = json.loads(proc.stdout)  # --json: standard output is the one object alone
    assert "$ " in proc.stderr and "fairseq_cli.train" in proc.stderr  # the command it ran
    assert set(printed) >= {"f1", "precision", "recall", "accuracy", "per_type"}
    cmd = json.loads((out / "ner" / "seed-1" / "result.json").read_text())["command"]
    for option in ("--lr 0.0003", "--layer-decay 0.8", "--lr-scheduler polynomial_decay",
                   "--warmup-updates 1", "--max-update 3", "--finetune-from-model"):
        assert option in " ".join(cmd)  # Small's recipe: 12 sentences, batch 32, 3 epochs
    again = run(command("tag", "predict", "--checkpoint", printed["model"], "--data",
                        out / "data", "--cpu", "--json"))
    assert json.loads(again.stdout.strip().splitlines()[-1])["f1"] == \
        pytest.approx(printed["f1"])
    assert (out / "valid.predictions.conll").read_text().count("\n\n") == 2
    rerun = run(command("tag", *argv))
    assert rerun.returncode == 0 and "(done: pre-trained, ner, seed 1)" in rerun.stderr
    assert json.loads(rerun.stdout) == printed
    other = tmp_path / "other.conll"
    other.write_text(NER)
    assert_one_line_error(run(command("tag", *argv[:3], "--train", other, *argv[5:])),
                          "holds train data preprocessed from", "give another --out-dir")


@pytest.mark.slow
def test_a_kind_from_a_user_dir(tmp_path, spm_data):
    """A kind in one --user-dir file (token scores: a regression head on every token) runs
    through trials and evaluation with no edit of the plugin, and its export is refused in one
    line (transformers has no class for its head)."""
    data = tmp_path / "scores"
    rng = random.Random(1)
    splits = {"train": [sentence(rng) for _ in range(24)],
              "valid": [sentence(rng) for _ in range(8)]}
    prep = run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(USER_KINDS)!r}); "
                f"import token_scores; token_scores.prepare({str(spm_data)!r}, {str(data)!r}, "
                f"{splits!r})"])
    assert prep.returncode == 0, failure("prepare", prep)
    assert read_task_file(data).kind == "token_scores"
    work = tmp_path / "work"
    proc = run(command("finetune", "trials", "--user-dir", USER_KINDS / "token_scores",
                       "--arch", "electra_tiny", "--task", f"scores={data}", "--trials", "2",
                       "--max-update", "6", "--cpu", "--out-dir", work))
    assert proc.returncode == 0, failure("electra-finetune trials", proc)
    saved = json.loads((work / "trials.json").read_text())
    assert [(r["kind"], r["metric"]) for r in saved["runs"]] == [("token_scores", "pearson")] * 2
    assert "| random init | scores | pearson | 2 |" in (work / "trials.md").read_text()
    export = run(command("convert", "export", "--checkpoint",
                         work / "scores" / "seed-1" / "checkpoint_last.pt",
                         "--out-dir", tmp_path / "hf"))
    assert_one_line_error(export, "head (token scores, --task token_scores) has no "
                                  "transformers class", "electra-extract")
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow  # electra-glue preprocess runs fairseq-preprocess
def test_sentence_tasks_of_ones_own(tmp_path, spm_data):
    """A three-way set and a regression set in GLUE's layout, by column: the classes from the
    training file, the metrics of their kind; what is wrong is one line."""
    rng = random.Random(3)
    for name, labels in (("nli", ["yes", "no", "maybe"]), ("sts", None)):
        d = tmp_path / name
        d.mkdir()
        for split in ("train", "dev"):
            rows = [f"{i}\t{sentence(rng)}\t{sentence(rng)}\t"
                    f"{rng.choice(labels) if labels else round(rng.uniform(0, 5), 2)}"
                    for i in range(12)]
            (d / f"{split}.tsv").write_text("\n".join(rows) + "\n")
        glue_cli.main(["preprocess", "--task", name, "--text-columns", "1,2", "--glue-dir",
                       str(d), "--no-header", "--pretrain-data", str(spm_data), "--out-dir",
                       str(tmp_path / f"{name}-bin"), *(["--regression"] if not labels else [])])
    nli, sts = (read_task_file(tmp_path / f"{n}-bin") for n in ("nli", "sts"))
    assert (nli.kind, nli.metrics, nli.labels) == ("sentence", ("accuracy", "mcc"),
                                                   ("maybe", "no", "yes"))
    assert (sts.metrics, sts.labels, nli.counts) == (("pearson", "spearman"), None,
                                                     {"train": 12, "valid": 12})
    assert nli.details == {"inputs": 2, "glue": False}
    from electra_plugin.finetuning import trials as tr

    task = tr.parse_task(f"mine={tmp_path / 'nli-bin'}")
    options = task.kind.train_options(task.prepared, ["--arch", "electra_tiny"])
    assert options[options.index("--num-classes") + 1] == "3"
    scores = tr.parse_task(f"s={tmp_path / 'sts-bin'}")
    assert "--regression-target" in scores.kind.train_options(scores.prepared, [])
    one = tmp_path / "one"
    one.mkdir()
    (one / "train.tsv").write_text("a cat\tx\nthe dog\tx\n")
    for name, rows in (("lost", "a cat\tx\nthe dog\n"), ("words", "a cat\tx\nthe dog\tnot x\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.tsv").write_text(rows)
    for glue_dir, argv, phrase in (
            ("nli", ["--text-columns", "one"], "--text-columns 'one' is not column numbers"),
            ("nli", [], "--task nli is not a GLUE task"),
            ("one", ["--text-columns", "0"], "has 1 label(s) in column -1; a classification "
                                              "task needs two or more (or give --regression)"),
            # a row that lost its label is not read as a text that is its own label
            ("lost", ["--text-columns", "0"], "train.tsv:2 has 1 tab-separated columns, nli needs "
                                              "at least 2; text in column(s) 0, the label in "
                                              "column -1"),
            ("words", ["--text-columns", "0"], "train.tsv:2: label 'not x' is more than one "
                                               "word; write each class as one (e.g. not_x)")):
        with pytest.raises(ElectraUsageError) as caught:
            glue_cli.main(["preprocess", "--task", "nli", "--glue-dir", str(tmp_path / glue_dir),
                           "--pretrain-data", str(spm_data), "--out-dir",
                           str(tmp_path / "x"), "--no-header", *argv])
        assert_usage_line(caught.value, phrase)
    assert not (tmp_path / "x").exists()
