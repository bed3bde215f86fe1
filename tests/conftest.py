"""Shared fixtures: a tiny English-like corpus binarized with fairseq-preprocess."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLUGIN = str(REPO / "electra_plugin")

SUBJECTS = ["the cat", "a dog", "my neighbour", "the old man", "a small child", "the teacher",
            "our team", "the river", "a red bird", "the city council"]
VERBS = ["sees", "likes", "builds", "paints", "follows", "answers", "watches", "carries"]
OBJECTS = ["a house", "the ball", "an apple", "the long road", "a quiet song", "the letter",
           "two boxes", "the green door", "a warm coat", "the morning news"]
TAILS = ["today", "in the park", "near the station", "after dinner", "with great care",
         "every winter", "before the storm", ""]


def write_corpus(path: Path, sentences: int, seed: int) -> None:
    """Templated sentences, a blank line between documents of 8 lines."""
    rng = random.Random(seed)
    lines = []
    for i in range(sentences):
        words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(TAILS)]
        lines.append(" ".join(w for w in words if w) + " .")
        if i % 8 == 7:
            lines.append("")
    path.write_text("\n".join(lines) + "\n")


def binarize(text_dir: Path, dest: Path, splits=("train", "valid")) -> Path:
    args = [sys.executable, "-m", "fairseq_cli.preprocess", "--only-source",
            "--destdir", str(dest), "--workers", "1"]
    for split in splits:  # train, valid or test
        args += [f"--{split}pref", str(text_dir / f"{split}.txt")]
    subprocess.run(args, check=True, capture_output=True)
    return dest


@pytest.fixture(scope="session")
def data_bin(tmp_path_factory) -> Path:
    """train (1200 sentences) and valid (80) binarized; dict.txt without <mask>."""
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root / "train.txt", 1200, seed=0)
    write_corpus(root / "valid.txt", 80, seed=1)
    return binarize(root, root / "bin")


def train_cmd(data: Path, save_dir: Path, *extra: str, arch: str = "electra_tiny"):
    """A small fairseq-train command line for the electra task on CPU."""
    return [
        sys.executable, "-m", "fairseq_cli.train", str(data), "--user-dir", PLUGIN,
        "--task", "electra", "--criterion", "electra", "--arch", arch, "--cpu",
        "--tokens-per-sample", "32", "--batch-size", "8", "--num-workers", "0",
        "--num-layers", "2", "--hidden-size", "64", "--num-heads", "4", "--ffn-size", "128",
        "--embedding-size", "32",
        "--optimizer", "adam", "--lr", "5e-4", "--lr-scheduler", "polynomial_decay",
        "--warmup-updates", "2", "--total-num-update", "100", "--save-dir", str(save_dir),
        "--log-format", "json", "--log-interval", "1", "--no-progress-bar", "--seed", "3",
        "--data-buffer-size", "0",  # fairseq's prefetch thread can abort the exit (README)
        *extra,
    ]


def built_from_command_line(data: Path, *extra: str):
    """-> (the whole config fairseq-train builds from a small electra command line, its
    task, its model), in process."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = [str(data), "--user-dir", PLUGIN, "--task", "electra", "--criterion", "electra",
            "--arch", "electra_tiny", "--cpu", "--tokens-per-sample", "32", "--batch-size", "8",
            "--optimizer", "electra_adam", "--weight-decay", "0.01", *extra]
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_training_parser(), argv))
    task = tasks.setup_task(cfg.task)
    return cfg, task, task.build_model(cfg.model)


def composed(config_dir: Path, name: str, *overrides: str):
    """-> the config fairseq-hydra-train builds from ``--config-dir config_dir --config-name
    name overrides``, in process: hydra's composition with fairseq's schema registered under
    the config's name (fairseq's hydra_init), then fairseq's defaults, resolved."""
    from fairseq.dataclass.initialize import add_defaults, hydra_init
    from fairseq.utils import import_user_module
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import_user_module(OmegaConf.create({"user_dir": PLUGIN}))  # as common.user_dir does
    hydra_init(name)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.1"):
        cfg = compose(config_name=name, overrides=list(overrides))
    add_defaults(cfg)
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))


def assert_one_line_error(proc, *phrases) -> str:
    """A failed command whose stderr ends in one plugin error line holding ``phrases``."""
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("electra_plugin: error: "), proc.stderr[-2000:]
    for phrase in phrases:
        assert phrase in last, last
    return last


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                          timeout=600, **kwargs)


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
