"""Shared fixtures: a tiny English-like corpus binarized with fairseq-preprocess."""

import sys
from pathlib import Path

import pytest

from helpers import PLUGIN, binarize, run, write_corpus


@pytest.fixture(scope="session")
def data_bin(tmp_path_factory) -> Path:
    """train (1200 sentences) and valid (80) binarized; dict.txt without <mask>."""
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root / "train.txt", 1200, seed=0)
    write_corpus(root / "valid.txt", 80, seed=1)
    return binarize(root, root / "bin")


@pytest.fixture(scope="session")
def spm_data(tmp_path_factory) -> Path:
    """The tiny corpus through electra-prepare (sentencepiece, 80 pieces)."""
    root = tmp_path_factory.mktemp("spm")
    write_corpus(root / "corpus.txt", 1500, seed=5)
    proc = run([sys.executable, "-m", "electra_plugin.cli.prepare", "--train",
                root / "corpus.txt", "--destdir", root / "bin", "--sentencepiece-vocab-size",
                "80", "--workers", "1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "bin"


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory, spm_data) -> Path:
    """A 6-update electra_tiny pre-training checkpoint on spm_data."""
    save = tmp_path_factory.mktemp("pretrained")
    proc = run([sys.executable, "-m", "fairseq_cli.train", spm_data, "--user-dir", PLUGIN,
                "--task", "electra", "--criterion", "electra", "--arch", "electra_tiny",
                "--cpu", "--tokens-per-sample", "64", "--batch-size", "8", "--num-workers", "0",
                "--optimizer", "electra_adam", "--lr", "5e-4", "--max-update", "6",
                "--save-dir", save, "--no-epoch-checkpoints", "--disable-validation",
                "--seed", "1", "--data-buffer-size", "0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return save / "checkpoint_last.pt"
