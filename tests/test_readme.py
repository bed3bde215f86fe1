"""The README's chain runs as written: its pre-training, fine-tuning and conversion blocks,
read from README.md itself (so they cannot drift), run in order in one directory laid out
as a clone's root, with the sizes shrunk by the substitutions listed here. The shell expands
each command line; a console script then runs as its entry point's module (``python -m``,
forked warm by the tests' fork server); test_installed runs the installed scripts themselves."""

import os
import re
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from helpers import REPO, failure, run, write_corpus, write_rte

SECTIONS = ("## Pre-training", "## Fine-tuning and evaluation",
            "## Conversion to and from transformers")
TINY_MODEL = "--num-layers 2 --hidden-size 64 --num-heads 4 --ffn-size 128 --embedding-size 32"
# (pattern, replacement): only sizes and counts change, and the corpus download
SHRINK = [
    (r"^python scripts/fetch_corpus\.py .*$", ""),  # the test writes a small news.txt
    (r"--sentencepiece-vocab-size \d+", "--sentencepiece-vocab-size 80 --no-byte-fallback"),
    (r"^(fairseq-hydra-train .*)$",
     r"\1 model._name=electra_tiny task.tokens_per_sample=32 dataset.batch_size=4 "
     r"task.global_batch_size=4 optimization.max_update=2 lr_scheduler.warmup_updates=1 "
     r"dataset.num_workers=0 common.cpu=true"),
    (r"--trials \d+", "--trials 1 --max-update 2 --batch-size 4 --cpu"),
    (r"(trials --arch electra_small) ", rf"\1 --model-options='{TINY_MODEL}' "),
    (r"^(electra-tag finetune .*)$", r"\1 --cpu"),
]


def readme_commands():
    """The shell commands of the README's chosen sections, in order, one per line (the
    continuation lines joined, comments dropped)."""
    text = (REPO / "README.md").read_text()
    commands = []
    for heading in SECTIONS:
        section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
        for block in re.findall(r"```bash\n(.*?)```", section, re.S):
            joined = re.sub(r"\\\n\s*", "", block)
            for line in joined.splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line and not line.startswith("#"):
                    commands.append(line)
    return commands


def shrunk(command):
    for pattern, replacement in SHRINK:
        command = re.sub(pattern, replacement, command, flags=re.M)
    return command


def as_module(command, cwd, env):
    """``command`` as the shell expands it, its console script as ``python -m`` its entry
    point's module (what each command module's ``__main__`` runs); others as they are."""
    argv = subprocess.run(["bash", "-c", f"set -- {command}; printf '%s\\0' \"$@\""], cwd=cwd,
                          env=dict(os.environ, **env), capture_output=True, text=True,
                          check=True).stdout.split("\0")[:-1]
    script = entry_points(group="console_scripts", name=argv[0])
    if not script:
        return ["bash", "-c", command]
    return [sys.executable, "-m", next(iter(script)).module, *argv[1:]]


def test_the_chain_is_what_the_readme_says():
    commands = readme_commands()
    starts = [c.split()[0] + (" " + c.split()[1] if c.startswith("electra-") else "")
              for c in commands]
    assert starts == [
        "python", "electra-prepare --train", "fairseq-hydra-train",
        "electra-glue preprocess", "electra-finetune trials", "electra-finetune trials",
        "electra-finetune test-outputs", "electra-tag finetune", "electra-finetune trials",
        "electra-convert export", "electra-convert import"]
    # each substitution applies somewhere: none is left over from an older README
    for pattern, _ in SHRINK:
        assert any(re.search(pattern, c, re.M) for c in commands), pattern


@pytest.mark.slow
def test_the_readme_chain_runs_as_written(tmp_path):
    for name in ("electra_plugin", "examples", "scripts"):  # a clone's root
        (tmp_path / name).symlink_to(REPO / name)
    write_corpus(tmp_path / "news.txt", 800, seed=2)
    glue = write_rte(tmp_path / "glue_data" / "RTE")
    (glue / "test.tsv").write_text("\n".join(
        ["index\tsentence1\tsentence2"] + [f"{i}\tthe cat sees a house .\tthe cat sees it ."
                                           for i in range(6)]) + "\n")
    conll = "\n\n".join("\n".join(f"{w}\t{'B-PER' if w == 'teacher' else 'O'}"
                                  for w in s.split()) for s in
                        ["the teacher sees a house", "a dog likes the teacher",
                         "the teacher paints the green door"] * 4)
    (tmp_path / "train.conll").write_text(conll + "\n")
    (tmp_path / "dev.conll").write_text(conll + "\n")
    (tmp_path / "suite.yaml").write_text("tasks:\n  RTE: data-bin/RTE\n  ner: ner/data\n")
    env = {"PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    for command in readme_commands():
        command = shrunk(command)
        if not command:
            continue
        proc = run(as_module(command, tmp_path, env), env=env, cwd=tmp_path)
        assert proc.returncode == 0, failure(command, proc)
    assert (tmp_path / "checkpoints" / "checkpoint_best.pt").is_file()  # where the README reads
    assert (tmp_path / "trials" / "small" / "trials.md").is_file()
    assert (tmp_path / "trials" / "random" / "trials.md").is_file()
    assert (tmp_path / "submission" / "RTE.tsv").is_file()
    assert (tmp_path / "ner" / "valid.predictions.conll").is_file()
    assert "average over 2 tasks" in (tmp_path / "trials" / "suite" / "trials.md").read_text()
    assert (tmp_path / "hf" / "config.json").is_file()
    assert (tmp_path / "imported" / "checkpoint.pt").is_file()
