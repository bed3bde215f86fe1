"""Long context with the modern body: a checkpoint resumed at a longer length with a larger
global RoPE theta (the context-extension stage), activation checkpointing, and the preset."""

import sys

import pytest
import torch
from omegaconf import OmegaConf
from helpers import REPO, composed, run_here, tiny_model

from electra_plugin.models.core.checkpoint import remember_settings
from electra_plugin.user_io.errors import ElectraUsageError


def saved_weights(model):
    """The model's state dict as a checkpoint hands it over: with the settings it was
    trained with (models/core/checkpoint.py's remember_settings), copied as a caller may copy
    it: the settings are an entry of the dict, which the copy keeps."""
    state = {"model": model.state_dict(), "cfg": {"model": model.cfg.copy()}}
    remember_settings(state, "stage1.pt")
    return dict(state["model"])


def test_a_longer_context_with_a_larger_global_theta_loads_the_shorter_checkpoint():
    short, task = tiny_model(encoder_body="modern", max_positions=1024,
                             global_rope_theta=10000.0)
    long, _ = tiny_model(task, encoder_body="modern", max_positions=8192,
                         global_rope_theta=160000.0)
    long.load_state_dict(saved_weights(short))
    assert all(torch.equal(a, b) for a, b in zip(short.state_dict().values(),
                                                  long.state_dict().values()))
    # the local layers' theta is no part of the extension; nor is BERT's length (its
    # positions are weights)
    other, _ = tiny_model(task, encoder_body="modern", local_rope_theta=160000.0)
    with pytest.raises(ElectraUsageError, match="--local-rope-theta 10000 where this command "
                                                "gives --local-rope-theta 160000"):
        other.load_state_dict(saved_weights(short))
    bert, _ = tiny_model(task, max_positions=128)
    bert_long, _ = tiny_model(task, max_positions=256)
    with pytest.raises(ElectraUsageError, match="--max-positions 128 where this command"):
        bert_long.load_state_dict(saved_weights(bert))


def test_checkpointed_activations_give_the_same_gradients():
    """Dropout on: the recomputed layers draw the same masks."""
    grads = []
    for recompute in (False, True):
        model, task = tiny_model(encoder_body="modern", num_layers=3, dropout=0.1,
                                 attention_dropout=0.1, checkpoint_activations=recompute)
        tokens = torch.randint(5, len(task.dictionary) - 1, (2, 64),
                               generator=torch.Generator().manual_seed(0))
        torch.manual_seed(1)
        model.discriminator(tokens)[0].pow(2).sum().backward()
        grads.append([p.grad for p in model.discriminator.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_checkpoint_activations_is_refused_by_a_body_without_it():
    with pytest.raises(ElectraUsageError, match="--checkpoint-activations is not implemented "
                                                "for --encoder-body deberta"):
        tiny_model(encoder_body="deberta", checkpoint_activations=True)


def test_the_context_extension_preset_resumes_at_8192_tokens_with_theta_160000():
    config = REPO / "examples" / "pretraining" / "config"
    cfg = composed(config, "electra_modern_small_extend_8k")
    assert cfg.model._name == "electra_modern_small"
    assert cfg.task.tokens_per_sample == cfg.model.max_positions == 8192
    assert cfg.model.global_rope_theta == 160000.0 and cfg.model.local_rope_theta == 10000.0
    # the stage-1 checkpoint, for the command line to give (fairseq then loads it with a
    # fresh optimizer and schedule)
    stage = OmegaConf.load(config / "stage" / "extend_8k.yaml")
    assert OmegaConf.is_missing(stage.checkpoint, "finetune_from_model")
    assert cfg.lr_scheduler.warmup_updates == 1000


@pytest.mark.slow
@pytest.mark.parametrize("break_mode", ["segment_pairs", "complete"])
def test_context_extension_continues_a_short_run_at_four_times_the_length(data_bin, tmp_path,
                                                                           break_mode):
    """Stage 1: 2 updates at 64 tokens, global theta 10,000; stage 2 from its checkpoint
    (--finetune-from-model) at 256 tokens, theta 160,000, its own schedule: the local layers
    run the window kernel (16-token window) and the samples fill the longer length."""
    from helpers import checkpoint, records, train_cmd
    modern = ("--encoder-body", "modern", "--local-attention", "16",
              "--sample-break-mode", break_mode, "--max-update", "2")
    first = run_here(train_cmd(data_bin, tmp_path / "stage1", *modern, "--max-positions", "64",
                               "--tokens-per-sample", "64", "--global-rope-theta", "10000"))
    assert first.returncode == 0, first.stderr[-2000:]
    second = run_here(train_cmd(data_bin, tmp_path / "stage2", *modern, "--max-positions", "256",
                                "--tokens-per-sample", "256", "--batch-size", "2",
                                "--finetune-from-model",
                                tmp_path / "stage1" / "checkpoint_last.pt"))
    assert second.returncode == 0, second.stderr[-2000:]
    log = second.stdout + second.stderr
    assert "context extension" in log and "--max-positions 64 -> 256" in log
    assert "--global-rope-theta 10000 -> 160000" in log
    steps = records(second.stdout)
    assert [r["num_updates"] for r in steps] == [1, 2]  # a schedule of its own
    assert steps[-1]["wpb"] > 2 * 64  # samples longer than stage 1's
    state = checkpoint(tmp_path / "stage2" / "checkpoint_last.pt")
    assert state["cfg"]["model"]["global_rope_theta"] == 160000.0


@pytest.mark.slow
def test_tagging_fine_tunes_a_long_context_checkpoint_on_sentences_past_512_pieces(
        spm_data, tmp_path, caplog):
    """A modern checkpoint of 1,024 positions tags whole sentences of ~750 pieces: electra-tag
    preprocess keeps them (--max-seq-len 1024, none cut), fairseq-train fine-tunes on them
    (the local layers through the window kernel) and predict labels every word."""
    import logging

    from helpers import PLUGIN, SUBJECTS, TINY_SIZES, failure, run_here, train_cmd

    from electra_plugin.cli import tag as tag_cli

    modern = ("--encoder-body", "modern", "--local-attention", "16", "--max-positions", "1024")
    pre = run_here(train_cmd(spm_data, tmp_path / "pre", *modern, "--max-update", "1"))
    assert pre.returncode == 0, failure("pre-training", pre)
    words = " ".join(SUBJECTS * 12).split()  # 288 words, 756 pieces: more than 512
    conll = "\n".join(f"{w}\t{'B-PER' if w == 'teacher' else 'O'}" for w in words) + "\n"
    (tmp_path / "long.conll").write_text(conll + "\n" + conll)
    with caplog.at_level(logging.INFO):
        assert tag_cli.main(["preprocess", "--pretrain-data", str(spm_data), "--train",
                             str(tmp_path / "long.conll"), "--valid", str(tmp_path / "long.conll"),
                             "--max-seq-len", "1024", "--out-dir", str(tmp_path / "ner")]) == 0
    assert f"2 sentences, {2 * len(words)} words, 0 sentences cut to 1024 tokens" in caplog.text
    tune = run_here([sys.executable, "-m", "fairseq_cli.train", tmp_path / "ner",
                     "--user-dir", PLUGIN,
                     "--task", "token_tagging", "--criterion", "token_tagging", "--arch",
                     "electra_tiny", *TINY_SIZES, *modern, "--cpu", "--optimizer", "electra_adam",
                     "--lr", "1e-3", "--batch-size", "1", "--max-update", "2", "--num-workers", "0",
                     "--save-dir", tmp_path / "ck", "--disable-validation",
                     "--finetune-from-model", tmp_path / "pre" / "checkpoint_last.pt"])
    assert tune.returncode == 0, failure("fine-tuning", tune)
    out = tmp_path / "long.predicted.conll"
    assert tag_cli.main(["predict", "--checkpoint", str(tmp_path / "ck" / "checkpoint_last.pt"),
                         "--data", str(tmp_path / "ner"), "--out", str(out), "--cpu"]) == 0
    rows = [line.split() for line in out.read_text().splitlines() if line.strip()]
    assert len(rows) == 2 * len(words) and [r[0] for r in rows[:len(words)]] == words
