"""The README's chain runs as written: its blocks from *Your corpus, one GPU* (raw Korean
text to a vocabulary, pre-training, continued pre-training from a transformers-written pair,
tasks of one's own, export and loading in transformers) and *Fine-tuning and evaluation*,
read from README.md itself (so they cannot drift), run in order in one directory laid out
as a clone's root, with the sizes shrunk by the substitutions listed here. The shell expands
each command line; a console script then runs as its entry point's module (``python -m``,
forked warm by the tests' fork server); test_installed runs the installed scripts themselves.
The fast tests hold the README's figures to the docs it names beside them."""

import json
import os
import random
import re
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
import torch

from helpers import REPO, failure, run, sentence, write_rte

SECTIONS = ("## Your corpus, one GPU", "## Fine-tuning and evaluation")
TINY_MODEL = "--num-layers 2 --hidden-size 64 --num-heads 4 --ffn-size 128 --embedding-size 32"
# (pattern, replacement): sizes and counts change, downloads give way to files the test
# writes, and the graphed step is left to tests/test_compile.py and test_graphed_checks.py
# (compiling it takes a CPU a minute or more)
SHRINK = [
    (r"^python scripts/fetch_corpus\.py .*$", ""),  # the test writes a small corpus.txt
    (r"^hf download .*$", ""),  # the test writes the transformers pair into hub/
    (r"--sentencepiece-vocab-size \d+", "--sentencepiece-vocab-size 80 --no-byte-fallback"),
    (r" (optimization\.max_update|lr_scheduler\.warmup_updates)=\d+", ""),
    (r"task\.graphed_step=true", "task.graphed_step=false"),
    (r"^(fairseq-hydra-train .*)$",
     r"\1 model._name=electra_tiny task.tokens_per_sample=32 dataset.batch_size=4 "
     r"task.global_batch_size=4 optimization.max_update=2 lr_scheduler.warmup_updates=1 "
     r"dataset.num_workers=0 common.cpu=true"),
    (r"--trials \d+", "--trials 1 --max-update 2 --batch-size 4 --cpu"),
    (r"(trials --arch electra_small) ", rf"\1 --model-options='{TINY_MODEL}' "),
]
# electra_tiny's sizes, the generator as wide as the discriminator (as in Google's Small pair)
TINY_PAIR = dict(embedding_size=64, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=512)
KOREAN = ["고양이가 집을 본다", "학생이 책을 읽는다", "아이가 문을 연다", "선생님이 그림을 그린다",
          "고양이가 책을 좋아한다", "학생이 집을 그린다"]


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
    point's module (what each command module's ``__main__`` runs), ``python`` as this
    interpreter (the environment's); others as they are."""
    argv = subprocess.run(["bash", "-c", f"set -- {command}; printf '%s\\0' \"$@\""], cwd=cwd,
                          env=dict(os.environ, **env), capture_output=True, text=True,
                          check=True).stdout.split("\0")[:-1]
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    script = entry_points(group="console_scripts", name=argv[0])
    if not script:
        return ["bash", "-c", command]
    return [sys.executable, "-m", next(iter(script)).module, *argv[1:]]


def test_the_chain_is_what_the_readme_says():
    commands = readme_commands()
    starts = [c.split()[0] + (" " + c.split()[1] if c.startswith(("electra-", "hf ")) else "")
              for c in commands]
    assert starts == [
        "python", "electra-prepare --train", "fairseq-hydra-train",
        "hf download", "hf download", "electra-convert import", "electra-prepare --train",
        "fairseq-hydra-train", "electra-glue preprocess", "electra-tag preprocess",
        "electra-finetune trials", "electra-convert export", "python",
        "electra-glue preprocess", "electra-finetune trials", "electra-finetune trials",
        "electra-finetune test-outputs"]
    # each substitution applies somewhere: none is left over from an older README
    for pattern, _ in SHRINK:
        assert any(re.search(pattern, c, re.M) for c in commands), pattern


def write_corpus_ko(path, lines=1200, seed=2):
    """Korean sentences and English ones in turn, a blank line between documents of 40 (the
    valid split, one document, then fills two batches of 4 in either vocabulary)."""
    rng = random.Random(seed)
    text = []
    for i in range(lines):
        text.append((rng.choice(KOREAN) if i % 2 else sentence(rng).rstrip(" .")) + " .")
        if i % 40 == 39:
            text.append("")
    path.write_text("\n".join(text) + "\n")


def write_pair(hub, corpus):
    """A random ElectraForPreTraining and ElectraForMaskedLM of electra_tiny's sizes, written
    by transformers as a released pair is, sharing their embeddings as ELECTRA trains them;
    a cased WordPiece vocabulary of the corpus's words and characters."""
    from transformers import (BertTokenizerFast, ElectraConfig, ElectraForMaskedLM,
                              ElectraForPreTraining)

    text = corpus.read_text()
    chars = sorted(set(text) - set(" \n"))
    vocab = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(text.split()))
             + [c for c in chars if c not in text.split()] + ["##" + c for c in chars])
    config = ElectraConfig(vocab_size=len(vocab), **TINY_PAIR)
    torch.manual_seed(0)
    discriminator, generator = ElectraForPreTraining(config), ElectraForMaskedLM(config)
    generator.electra.embeddings.load_state_dict(discriminator.electra.embeddings.state_dict())
    for name, model in (("discriminator", discriminator), ("generator", generator)):
        folder = hub / f"electra-small-{name}"
        folder.mkdir(parents=True)
        (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
        BertTokenizerFast(str(folder / "vocab.txt"), do_lower_case=False).save_pretrained(folder)
        model.save_pretrained(folder)


def write_own_tasks(root, seed=3):
    """A topic TSV pair (animals or people) and NER CoNLL files of the corpus's words."""
    rng = random.Random(seed)
    (root / "topic").mkdir(parents=True)
    (root / "ner").mkdir()
    for split, n in (("train", 48), ("dev", 16)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            line = rng.choice(KOREAN)
            rows.append(f"{line} .\t{'animal' if line.startswith('고양이') else 'people'}")
        (root / "topic" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
        sentences = ["\n".join(f"{w}\t{'B-PER' if w in ('학생이', '선생님이') else 'O'}"
                                for w in (rng.choice(KOREAN) + " .").split()) for _ in range(n)]
        (root / "ner" / f"{split}.conll").write_text("\n\n".join(sentences) + "\n")


@pytest.mark.slow
def test_the_readme_chain_runs_as_written(tmp_path):
    for name in ("electra_plugin", "examples", "scripts"):  # a clone's root
        (tmp_path / name).symlink_to(REPO / name)
    write_corpus_ko(tmp_path / "corpus.txt")
    write_pair(tmp_path / "hub", tmp_path / "corpus.txt")
    write_own_tasks(tmp_path / "my_tasks")
    glue = write_rte(tmp_path / "glue_data" / "RTE")
    (glue / "test.tsv").write_text("\n".join(
        ["index\tsentence1\tsentence2"] + [f"{i}\tthe cat sees a house .\tthe cat sees it ."
                                           for i in range(6)]) + "\n")
    env = {"PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    printed = {}
    for command in readme_commands():
        command = shrunk(command)
        if not command:
            continue
        proc = run(as_module(command, tmp_path, env), env=env, cwd=tmp_path)
        assert proc.returncode == 0, failure(command, proc)
        printed[command.split()[0]] = proc.stdout
    # the Korean text held out its valid split and kept its own script
    assert (tmp_path / "data-bin" / "corpus" / "valid.bin").stat().st_size > 0
    pieces = json.loads((tmp_path / "data-bin" / "corpus" / "tokenizer.json").read_text())
    assert any("고" in piece for piece, _ in pieces["model"]["vocab"])
    assert (tmp_path / "checkpoints" / "checkpoint_best.pt").is_file()  # where the README reads
    # the continued run started from the import: two updates at lr 1e-4 move no weight far
    imported = torch.load(tmp_path / "imported" / "electra-small" / "checkpoint.pt",
                          map_location="cpu")["model"]
    continued = torch.load(tmp_path / "checkpoints" / "continued" / "checkpoint_last.pt",
                           map_location="cpu")
    assert continued["optimizer_history"][-1]["num_updates"] == 2
    for key, value in imported.items():
        assert (continued["model"][key] - value).abs().max() < 1e-2, key
    assert "'label': '" in printed["python"]  # transformers' pipeline read the export
    assert "average over 2 tasks" in (tmp_path / "trials" / "mine" / "trials.md").read_text()
    assert (tmp_path / "trials" / "small" / "trials.md").is_file()
    assert (tmp_path / "trials" / "random" / "trials.md").is_file()
    assert (tmp_path / "submission" / "RTE.tsv").is_file()


# a measured figure: a number (or range) with its unit, or a clock time (minutes:seconds)
FIGURE = re.compile(r"(?<![\w.,/-])(\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?)"
                    r"(?:\s?(?:ms|s|minutes|hours|h|tokens/s|updates/s|words/s|MB|MiB|GB|GiB)"
                    r"(?![\w/])|(?:x|%)(?!\w))|(?<![\w:])(\d+:\d\d)(?![\d:])")
POINTER = re.compile(r"docs/\w+\.md")


def blocks(text):
    """(first line number, text) of each run of non-blank lines outside code blocks."""
    found, current, fenced = [], None, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            fenced, current = not fenced, None
        elif fenced or not line.strip():
            current = None
        elif current is None:
            current = [number, line]
            found.append(current)
        else:
            current[1] += "\n" + line
    return found


def unsourced_figures(readme, read_doc):
    """'line: figure (docs)' for each figure of a README paragraph or table that names docs
    (docs/X.md) which none of them holds: the likely next contradiction is a figure updated
    in a doc and not where the README quotes it, or the other way round."""
    missing = []
    for line, block in blocks(readme):
        docs = sorted(set(POINTER.findall(block)))
        if not docs:
            continue
        texts = [read_doc(doc) for doc in docs]
        for match in FIGURE.finditer(block):
            for number in re.split(r"(?<=\d)-", match.group(1) or match.group(2)):
                held = re.compile(rf"(?<![\d.,]){re.escape(number)}(?![\d]|[.,:]\d)")
                if not any(held.search(t) for t in texts):
                    missing.append(f"README.md:{line}: {match.group(0)} ({', '.join(docs)})")
    return missing


def test_figures_the_readme_quotes_beside_a_doc_are_in_that_doc():
    readme = (REPO / "README.md").read_text()
    assert unsourced_figures(readme, lambda doc: (REPO / doc).read_text()) == []


def test_a_figure_changed_on_one_side_is_caught():
    readme = (REPO / "README.md").read_text()
    quoted = [(line, m.group(1) or m.group(2), m.group(0)) for line, block in blocks(readme)
              if POINTER.search(block) for m in FIGURE.finditer(block)]
    assert len(quoted) > 20  # the check reads the README's figures, not none of them
    line, number, figure = next(q for q in quoted if "43.2" in q[2])  # command 1's minutes
    other = "47.2"
    # the README's figure changed, its doc's not
    missing = unsourced_figures(readme.replace(figure, figure.replace(number, other), 1),
                                lambda doc: (REPO / doc).read_text())
    assert missing == [f"README.md:{line}: {other} minutes (docs/main_job.md, docs/testing.md)"]
    # the doc's changed, the README's not
    missing = unsourced_figures(readme, lambda doc: (REPO / doc).read_text().replace(number, other))
    assert missing == [f"README.md:{line}: {figure} (docs/main_job.md, docs/testing.md)"]
