"""fairseq's own fine-tuning recipes run unchanged with an ELECTRA model."""

import random
import sys

import torch

import pytest

from electra_plugin.data.binarize import fairseq_preprocess
from electra_plugin.data.tokenizer import load_tokenizer
from helpers import OBJECTS, PLUGIN, SUBJECTS, VERBS, run, run_here

# The shape of fairseq's examples/roberta/config/finetuning/*.yaml (RoBERTa's GLUE recipe),
# written out here; only the model name changes.
ROBERTA_STYLE_RTE = """\
# @package _group_
common:
  log_format: json
  log_interval: 1
task:
  _name: sentence_prediction
  data: ???
  init_token: 0
  separator_token: 2
  num_classes: 2
  max_positions: 512
checkpoint:
  restore_file: ???
  reset_optimizer: true
  reset_dataloader: true
  reset_meters: true
  best_checkpoint_metric: accuracy
  maximize_best_checkpoint_metric: true
  no_epoch_checkpoints: true
distributed_training:
  find_unused_parameters: true
  distributed_world_size: 1
criterion:
  _name: sentence_prediction
dataset:
  batch_size: 8
  required_batch_size_multiple: 1
  max_tokens: 4400
optimizer:
  _name: adam
  weight_decay: 0.1
  adam_betas: (0.9,0.98)
  adam_eps: 1e-06
lr_scheduler:
  _name: polynomial_decay
  warmup_updates: 1
optimization:
  clip_norm: 0.0
  lr: [2e-05]
  max_update: 3
  max_epoch: 10
model:
  _name: roberta
  dropout: 0.1
  attention_dropout: 0.1
"""


def sentence(rng):
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ."


def binarize_texts(spm_data, dest, columns, n, seed):
    """columns: {name: function(rng, i) -> text}; writes dest/name/{train,valid}.bin."""
    tokenizer = load_tokenizer(str(spm_data))
    rng = random.Random(seed)
    rows = [{name: make(rng, i) for name, make in columns.items()} for i in range(n)]
    for name in columns:
        for split, part in (("train", rows[: n // 2]), ("valid", rows[n // 2:])):
            (dest / f"{split}.{name}").write_text(
                "\n".join(tokenizer.encode_line(r[name]) for r in part) + "\n")
        fairseq_preprocess(str(dest / name), str(spm_data / "dict.txt"),
                           {"trainpref": str(dest / f"train.{name}"),
                            "validpref": str(dest / f"valid.{name}")})
    return rows


@pytest.mark.slow
def test_roberta_glue_yaml_runs_with_an_electra_model(tmp_path, spm_data, pretrained):
    rows = binarize_texts(spm_data, tmp_path, {"input0": lambda r, i: sentence(r),
                                               "input1": lambda r, i: sentence(r)}, 32, 0)
    labels = ["yes" if i % 2 else "no" for i in range(len(rows))]
    for split, part in (("train", labels[:16]), ("valid", labels[16:])):
        (tmp_path / f"{split}.label").write_text("\n".join(part) + "\n")
    fairseq_preprocess(str(tmp_path / "label"), None,
                       {"trainpref": str(tmp_path / "train.label"),
                        "validpref": str(tmp_path / "valid.label")})
    config = tmp_path / "config"
    config.mkdir()
    (config / "rte.yaml").write_text(ROBERTA_STYLE_RTE)
    save = tmp_path / "ck"
    proc = run([sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", config,
                "--config-name", "rte", "model._name=electra_tiny", f"task.data={tmp_path}",
                f"common.user_dir={PLUGIN}", f"checkpoint.restore_file={pretrained}",
                f"checkpoint.save_dir={save}", "common.cpu=true",
                "dataset.data_buffer_size=0", f"hydra.run.dir={tmp_path / 'hydra'}"],
               cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    state = torch.load(save / "checkpoint_last.pt", weights_only=False)
    assert state["cfg"]["model"]["_name"] == "electra_tiny"
    assert state["optimizer_history"][-1]["num_updates"] == 3
    head = "classification_heads.sentence_classification_head.out_proj.weight"
    assert state["model"][head].shape[0] == 2


@pytest.mark.slow
def test_sentence_ranking_task(tmp_path, spm_data, pretrained):
    """fairseq's sentence_ranking: one shared context, three options, one head score each."""
    columns = {"input0": lambda r, i: sentence(r)}
    for k in range(3):
        columns[f"input{k + 1}"] = lambda r, i: sentence(r)
    rows = binarize_texts(spm_data, tmp_path, columns, 24, 1)
    (tmp_path / "label").mkdir()
    for split, part in (("train", rows[:12]), ("valid", rows[12:])):
        (tmp_path / "label" / f"{split}.label").write_text(
            "\n".join(str(i % 3) for i in range(len(part))) + "\n")
    save = tmp_path / "ck"
    proc = run_here([sys.executable, "-m", "fairseq_cli.train", tmp_path, "--user-dir", PLUGIN,
                     "--task", "sentence_ranking", "--criterion", "sentence_ranking",
                     "--num-classes", "3", "--init-token", "0", "--arch", "electra_tiny", "--cpu",
                     "--restore-file", pretrained, "--reset-optimizer", "--reset-dataloader",
                     "--reset-meters", "--optimizer", "electra_adam", "--lr", "1e-4",
                     "--batch-size", "4", "--max-update", "3", "--save-dir", save,
                     "--num-workers", "0", "--data-buffer-size", "0", "--max-positions", "512"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    state = torch.load(save / "checkpoint_last.pt", weights_only=False)
    head = [k for k in state["model"] if k.endswith("out_proj.weight")]
    assert len(head) == 1 and state["model"][head[0]].shape[0] == 1  # one score per option
    assert state["optimizer_history"][-1]["num_updates"] == 3
