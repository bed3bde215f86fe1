"""GLUE: official file layout -> binarized data -> fine-tuning -> official metrics."""

import json
import math
import random
import re
import sys

import numpy as np
import pytest
import torch

from electra_plugin.cli import glue as glue_cli
from electra_plugin.data import glue
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import (
    GLUE, PLUGIN, REPO, assert_usage_error, composed, digest, preprocess, run, run_here,
    sentence, train_in_process, write_rte,
)


def write_stsb(root, n=40, seed=1):
    rng = random.Random(seed)
    root.mkdir(parents=True)
    for split in ("train", "dev"):
        rows = ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
                "sentence2\tscore"]
        for i in range(n):
            rows.append(f"{i}\tmain\tf\t2012\t{i}\ts\ts\t{sentence(rng)}\t{sentence(rng)}\t"
                        f"{rng.uniform(0, 5):.3f}")
        (root / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return root


def write_cola(root, n=30, seed=2):
    rng = random.Random(seed)
    root.mkdir(parents=True)
    for split in ("train", "dev"):
        rows = [f"src\t{rng.randint(0, 1)}\t\t{sentence(rng)}" for _ in range(n)]
        (root / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return root


def test_official_metrics_on_hand_checked_cases():
    # pred 1 0 1 1 / gold 1 0 0 1: tp 2, tn 1, fp 1, fn 0
    pred, gold = [1, 0, 1, 1], [1, 0, 0, 1]
    assert glue.accuracy(pred, gold) == 0.75
    assert glue.f1(pred, gold) == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert glue.mcc(pred, gold) == pytest.approx((2 * 1 - 1 * 0) / math.sqrt(3 * 2 * 2 * 1))
    assert glue.f1([0, 0], [0, 0]) == 0.0  # no positive class at all
    assert glue.mcc([1, 1, 1], [1, 0, 1]) == 0.0  # an empty marginal
    x = [1.0, 2.0, 3.0, 4.0]
    assert glue.pearson(x, [2.0, 4.0, 6.0, 8.0]) == pytest.approx(1.0)
    assert glue.pearson(x, [8.0, 6.0, 4.0, 2.0]) == pytest.approx(-1.0)
    # monotone but not linear: rank correlation 1, linear correlation below 1
    assert glue.spearman(x, [1.0, 10.0, 100.0, 1000.0]) == pytest.approx(1.0)
    assert glue.pearson(x, [1.0, 10.0, 100.0, 1000.0]) < 0.9
    # ties share their mean rank: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4)
    assert glue.spearman([1.0, 2.0, 2.0, 3.0], x) == pytest.approx(
        float(np.corrcoef([1, 2.5, 2.5, 4], [1, 2, 3, 4])[0, 1]))
    assert glue.pearson(x, [5.0] * 4) == 0.0 == glue.spearman([5.0] * 4, x)  # constant: 0
    assert glue.score(glue.get_task("mrpc"), pred, gold) == {
        "f1": pytest.approx(80.0), "accuracy": 75.0}
    assert glue.score(glue.get_task("sts-b"), x, [2.0, 4.0, 6.0, 8.0]) == {
        "pearson": pytest.approx(100.0), "spearman": pytest.approx(100.0)}


EPOCHS = {"RTE": 10, "STS-B": 10}  # ELECTRA's recipe (PAPER.md): 3 epochs for the others


@pytest.mark.filterwarnings("ignore::UserWarning")  # hydra's deprecation notes
@pytest.mark.parametrize("name", glue.GLUE_TASKS)
def test_glue_configs_follow_the_recipe_and_the_task_table(name):
    """What a task's config restates from electra_plugin.data.glue (classes, checkpoint metric,
    the train set's batches) agrees with it; the recipe's batch, epochs, warm-up and sizes."""
    task = glue.GLUE_TASKS[name]
    config = REPO / "examples" / "glue" / "config"
    file = name.lower().replace("-", "")
    cfg = composed(config, file)
    assert cfg.task.num_classes == task.num_classes
    assert cfg.criterion.regression_target == (task.labels is None)
    assert cfg.checkpoint.best_checkpoint_metric == task.metrics[0]
    # the criterion logs the task's metric in validation, no flag needed
    assert cfg.criterion._name == "sentence_prediction_metrics"
    assert not any(on for k, on in cfg.criterion.items() if k.startswith("report_"))
    assert cfg.dataset.batch_size == 32 and cfg.optimization.max_epoch == EPOCHS.get(name, 3)
    total = cfg.optimization.max_update
    assert total == cfg.optimization.max_epoch * math.ceil(task.train_size / 32)
    assert cfg.lr_scheduler.total_num_update == total
    assert cfg.lr_scheduler.warmup_updates == math.ceil(0.1 * total)
    assert cfg.model._name == "electra_small"  # the size when none is picked


@pytest.mark.filterwarnings("ignore::UserWarning")  # hydra's deprecation notes
@pytest.mark.parametrize("size, lr, decay", [("small", 3e-4, 0.8), ("base", 1e-4, 0.8),
                                             ("large", 5e-5, 0.9)])
def test_glue_sizes_give_electras_lr_and_layer_decay(size, lr, decay):
    """ELECTRA's per-size lr and layer-wise lr decay, picked with size= (the same size files
    for every task: test_configs.py composes each task with one of them)."""
    cfg = composed(REPO / "examples" / "glue" / "config", "rte", f"size={size}")
    assert cfg.model._name == f"electra_{size}" and list(cfg.optimization.lr) == [lr]
    assert cfg.optimizer.layer_decay == decay


@pytest.mark.slow
def test_rte_preprocess_finetune_evaluate(tmp_path, spm_data, pretrained):
    glue_dir = write_rte(tmp_path / "RTE")
    dest = tmp_path / "RTE-bin"
    proc = preprocess("RTE", glue_dir, spm_data, dest)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for sub in ("input0", "input1", "label"):
        assert (dest / sub / "train.bin").exists() and (dest / sub / "valid.bin").exists()
    labels = (dest / "label" / "dict.txt").read_text().split()
    assert labels[0::2] == ["entailment", "not_entailment"]

    save = tmp_path / "ft"
    proc = run([sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir",
                REPO / "examples" / "glue" / "config", "--config-name", "rte",
                f"common.user_dir={PLUGIN}", f"task.data={dest}",
                f"checkpoint.restore_file={pretrained}", f"checkpoint.save_dir={save}",
                "model._name=electra_tiny", "common.cpu=true", "optimization.max_update=4",
                "optimization.max_epoch=1", "lr_scheduler.total_num_update=4",
                "lr_scheduler.warmup_updates=1", "dataset.batch_size=16",
                "dataset.num_workers=0", "dataset.data_buffer_size=0",
                f"hydra.run.dir={tmp_path / 'hydra'}"],
               cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    log = proc.stdout + proc.stderr
    assert "electra_adam" in log and "'layer_decay': 0.8" in log
    state = torch.load(save / "checkpoint_best.pt", weights_only=False)
    assert not any(k.startswith("generator") for k in state["model"])
    assert state["model"]["classification_heads.sentence_classification_head.out_proj.weight"] \
        .shape[0] == 2

    proc = run([*GLUE, "evaluate", "--task", "RTE", "--checkpoint",
                save / "checkpoint_best.pt", "--data", dest, "--json",
                "--out", tmp_path / "pred.txt"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"predicting valid: \d+/\d+ \(100%\) batches in", proc.stderr)  # progress
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["n"] == 40 and 0 <= result["accuracy"] <= 100
    from electra_plugin.data.evaluation import predict_split
    from electra_plugin.models.hub_interface import from_pretrained

    hub = from_pretrained(str(save), "checkpoint_best.pt", str(dest))
    preds, gold = predict_split(hub.model, hub.task, "valid")
    assert all(isinstance(p, int) for p in preds) and all(isinstance(g, int) for g in gold)
    assert len(preds) == len(gold) == 40
    predictions = (tmp_path / "pred.txt").read_text().split()
    assert len(predictions) == 40 and set(predictions) <= {"entailment", "not_entailment"}
    gold = [row.split("\t")[-1] for row in (glue_dir / "dev.tsv").read_text().splitlines()[1:]]
    assert result["accuracy"] == pytest.approx(
        100 * np.mean([p == g for p, g in zip(predictions, gold)]))


@pytest.mark.slow
def test_stsb_regression_and_cola_without_header(tmp_path, spm_data, pretrained):
    stsb = tmp_path / "STS-B-bin"
    assert preprocess("STS-B", write_stsb(tmp_path / "STS-B"), spm_data, stsb).returncode == 0
    assert len((stsb / "label" / "valid.label").read_text().split()) == 40
    cola = tmp_path / "CoLA-bin"
    proc = preprocess("CoLA", write_cola(tmp_path / "CoLA"), spm_data, cola)
    assert proc.returncode == 0 and "dev: 30 examples" in proc.stderr

    save = tmp_path / "ft"
    proc = run_here([sys.executable, "-m", "fairseq_cli.train", stsb, "--user-dir", PLUGIN,
                     "--task", "sentence_prediction", "--arch", "electra_tiny", "--cpu",
                     "--criterion", "sentence_prediction_metrics", "--regression-target",
                     "--num-classes", "1", "--init-token", "0", "--restore-file", pretrained,
                     "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--optimizer",
                     "electra_adam", "--layer-decay", "0.8", "--lr", "1e-4", "--batch-size", "8",
                     "--max-update", "3", "--save-dir", save, "--best-checkpoint-metric", "pearson",
                     "--maximize-best-checkpoint-metric", "--num-workers", "0",
                     "--data-buffer-size", "0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    valid = [line for line in proc.stdout.splitlines() if "valid on 'valid' subset" in line]
    assert valid and "| pearson " in valid[-1] and "| spearman " in valid[-1], valid
    assert (save / "checkpoint_best.pt").is_file()
    proc = run([*GLUE, "evaluate", "--task", "STS-B",
                "--checkpoint", save / "checkpoint_last.pt", "--data", stsb, "--json"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) >= {"pearson", "spearman"} and -100 <= result["pearson"] <= 100


def finetune_cmd(data, pretrained, save, *extra):
    return [sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN,
            "--task", "sentence_prediction", "--arch", "electra_tiny", "--cpu",
            "--criterion", "sentence_prediction", "--num-classes", "2", "--init-token", "0",
            "--restore-file", pretrained, "--reset-optimizer", "--reset-dataloader",
            "--reset-meters", "--optimizer", "electra_adam", "--lr", "1e-4", "--batch-size",
            "8", "--max-update", "2", "--save-dir", save, "--num-workers", "0",
            "--data-buffer-size", "0", *extra]


@pytest.fixture(scope="module")
def rte_bin(tmp_path_factory, spm_data):
    root = tmp_path_factory.mktemp("rte")
    glue_cli.main(["preprocess", "--task", "RTE", "--glue-dir", str(write_rte(root / "RTE", 24, 8)),
                   "--pretrain-data", str(spm_data), "--destdir", str(root / "bin")])  # in process
    return root / "bin"


@pytest.mark.slow
def test_data_binarized_with_another_dictionary(tmp_path, rte_bin, pretrained):
    data = tmp_path / "data"
    import shutil

    shutil.copytree(rte_bin, data)
    d = data / "input0" / "dict.txt"
    d.write_text(d.read_text() + "extra_word 1\n")
    assert_usage_error(finetune_cmd(data, pretrained, tmp_path / "ck"),
                       "binarized with another dict.txt")


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_evaluate_on_the_gpu_matches_the_cpu(tmp_path, rte_bin, pretrained):
    save = tmp_path / "ck"
    proc = run_here(finetune_cmd(rte_bin, pretrained, save))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {}
    for device, flags in (("cuda", []), ("cpu", ["--cpu"])):  # the GPU unless --cpu
        predictions = tmp_path / f"{device}.txt"
        proc = run([*GLUE, "evaluate", "--task", "RTE", "--checkpoint",
                    save / "checkpoint_last.pt", "--data", rte_bin, "--json",
                    "--predictions", predictions, *flags])
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"predicting valid on {device}" in proc.stderr, proc.stderr[-2000:]
        results[device] = (json.loads(proc.stdout.strip().splitlines()[-1]),
                           predictions.read_text().split())
    assert results["cuda"] == results["cpu"]
    assert len(results["cpu"][1]) == results["cpu"][0]["n"] == 8


@pytest.mark.slow
def test_head_with_another_class_count(tmp_path, rte_bin, pretrained):
    first = tmp_path / "first"
    train_in_process(finetune_cmd(rte_bin, pretrained, first))
    before = digest(first / "checkpoint_last.pt")
    assert_usage_error(finetune_cmd(rte_bin, first / "checkpoint_last.pt", tmp_path / "second",
                                    "--num-classes", "3"),
                       "has 2 classes but this run asks for 3", "--classification-head-name")
    assert digest(first / "checkpoint_last.pt") == before
    assert not list((tmp_path / "second").glob("*.pt"))


@pytest.mark.slow
def test_long_pairs_are_cut_to_fit_the_positions(tmp_path, spm_data):
    """Sequences longer than --max-seq-len are cut longest-first, never past the model."""
    rte = write_rte(tmp_path / "RTE", 8, 4)
    rows = (rte / "train.tsv").read_text().splitlines()
    long_premise = " ".join(["the old man sees a house today"] * 40)
    rows[1] = f"0\t{long_premise}\ta dog likes it .\tentailment"
    (rte / "train.tsv").write_text("\n".join(rows) + "\n")
    proc = preprocess("RTE", rte, spm_data, tmp_path / "bin", "--max-seq-len", "64")
    assert proc.returncode == 0 and "train: 8 examples, 1 cut to 64 tokens" in proc.stderr
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(str(tmp_path / "bin" / "input0" / "dict.txt"))
    first = data_utils.load_indexed_dataset(str(tmp_path / "bin" / "input0" / "train"), d)
    second = data_utils.load_indexed_dataset(str(tmp_path / "bin" / "input1" / "train"), d)
    # <s> + input0 (ends with </s>) + input1 (ends with </s>)
    assert 1 + len(first[0]) + len(second[0]) == 64
    from electra_plugin.data.tokenizer import load_tokenizer

    short = load_tokenizer(str(spm_data)).pieces("a dog likes it .")
    assert len(second[0]) == len(short) + 1  # the short side is kept whole


def test_preprocess_errors(tmp_path, spm_data):
    """electra-glue preprocess's main, in process (the console script's one-line edge is
    errors.command_line, which test_errors runs as a real command)."""

    def error(task, glue_dir, dest, *extra):
        with pytest.raises(ElectraUsageError) as caught:
            glue_cli.main(["preprocess", "--task", task, "--glue-dir", str(glue_dir),
                           "--pretrain-data", str(spm_data), "--destdir", str(dest), *extra])
        return str(caught.value)

    rte = write_rte(tmp_path / "RTE", 4, 4)
    assert "--max-seq-len 9000" in error("RTE", rte, tmp_path / "out", "--max-seq-len", "9000")
    assert "--task NOPE is not a GLUE task" in error("NOPE", rte, tmp_path / "out")
    (rte / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\tA\tB\tmaybe\n")
    assert "label 'maybe'" in error("RTE", rte, tmp_path / "out")
    (rte / "dev.tsv").write_bytes(b"index\tsentence1\tsentence2\tlabel\n0\tA caf\xe9\tB\t"
                                  b"entailment\n")  # Latin-1
    assert f"{rte / 'dev.tsv'}:2 is not UTF-8 text (byte 0xe9); convert the file first" in \
        error("RTE", rte, tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    line = error("RTE", write_rte(tmp_path / "RTE2", 4, 4), tmp_path / "full")
    assert "already holds files" in line and "--force" in line
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
