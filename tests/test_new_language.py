"""docs/new_language.md, the Korean guide: its bash blocks run in order at tiny sizes on the
Korean text of ../shared/seeds, from raw text to a trials table."""

import json
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from electra_plugin.data.tokenizer import load_tokenizer
from forkserver import warm_python
from helpers import REPO, failure

GUIDE = REPO / "docs" / "new_language.md"
SEEDS = REPO.parent / "shared" / "seeds"
# What the test shrinks: (pattern in the guide, its tiny replacement); each must match once.
TINY = [
    ("--sentencepiece-vocab-size 32000",
     "--sentencepiece-vocab-size 1000 --workers 1 --min-valid-lines 40"),
    ("checkpoint.save_dir=$PWD/checkpoints/ko-tiny",
     "checkpoint.save_dir=$PWD/checkpoints/ko-tiny optimization.max_update=30 "
     "lr_scheduler.warmup_updates=3 lr_scheduler.total_num_update=30 dataset.batch_size=8 "
     "common.log_interval=5 dataset.validate_interval_updates=30 "
     "checkpoint.save_interval_updates=30"),
    ("--trials 5", "--trials 2 --max-update 6 --batch-size 8"),
    ("--jobs 2", "--jobs 1"),
]
LEFT_OUT = "--config-name electra_small"  # the real pre-training run
COMMANDS = ("electra-prepare", "fairseq-hydra-train", "electra-glue", "electra-finetune")


def guide_blocks():
    """The guide's bash blocks in order, at tiny sizes, without the real pre-training run."""
    blocks = re.findall(r"^```bash\n(.*?)^```$", GUIDE.read_text(encoding="utf-8"),
                        flags=re.S | re.M)
    kept = [b for b in blocks if LEFT_OUT not in b]
    assert len(kept) == len(blocks) - 1
    for pattern, tiny in TINY:
        assert sum(b.count(pattern) for b in kept) == 1, f"the guide's commands no longer " \
                                                         f"have {pattern!r} once"
        kept = [b.replace(pattern, tiny) for b in kept]
    return kept


def korean_sentences():
    """Sentences of the seeds with at least five Hangul syllables."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(SEEDS.glob("*.txt")))
    parts = re.split(r"(?<=[.!?])\s+|\n", text)
    return [" ".join(p.split()) for p in parts if len(re.findall("[\uac00-\ud7a3]", p)) >= 5]


def write_nsmc_like(path, sentences):
    """NSMC's layout (id, document, label; a header), labelled by a rule: 1 when the sentence
    holds an English word. One empty document, which the guide's conversion drops."""
    rows = [f"{i}\t{s}\t{int(bool(re.search('[A-Za-z]{2,}', s)))}"
            for i, s in enumerate(sentences)]
    path.write_text("id\tdocument\tlabel\n" + "\n".join(rows) + "\n9999\t\t0\n",
                    encoding="utf-8")


def logged(name, text):
    """The values of ``name=`` on fairseq's train_inner lines."""
    return [float(v) for v in re.findall(rf"\b{name}=([0-9.]+)", text)]


@pytest.mark.slow  # electra-prepare, fairseq-hydra-train and fine-tuning runs
@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"no Korean text: {SEEDS} is missing")
def test_the_korean_guide_runs_from_raw_text_to_a_trials_table(tmp_path):
    work = tmp_path / "main"  # the repository root as the guide sees it
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "seeds").symlink_to(SEEDS)
    work.mkdir()
    for name in ("examples", "electra_plugin"):
        (work / name).symlink_to(REPO / name)
    sentences = korean_sentences()
    write_nsmc_like(work / "ratings_train.txt", sentences[::2])
    write_nsmc_like(work / "ratings_test.txt", sentences[1::2])
    logs = []
    # python and the console scripts forked warm (forkserver.warm_python; test_installed runs
    # the installed scripts themselves)
    python = warm_python(tmp_path, COMMANDS)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PATH=os.pathsep.join([str(python.parent), str(Path(sys.executable).parent),
                                     os.environ["PATH"]]))
    for block in guide_blocks():
        result = subprocess.run(["bash", "-e", "-c", block], cwd=work, env=env, text=True,
                                capture_output=True, timeout=300)
        assert result.returncode == 0, failure(block.splitlines()[0], result)
        logs.append(result.stdout + result.stderr)
    prepare_log, train_log = logs[1], logs[2]

    # the tokenizer covers the Korean text: byte fallback leaves no <unk>, few characters
    # lack a piece (spelled in bytes), and NFD Hangul reads as NFC
    unk = re.search(r"encoded train: \d+ lines, (\d+) pieces, (\d+) <unk> \([0-9.]+%\), "
                    r"(\d+) byte pieces", prepare_log)
    assert unk and int(unk.group(2)) == 0, prepare_log[-2000:]
    assert int(unk.group(3)) / int(unk.group(1)) < 0.01, prepare_log[-2000:]
    tokenizer = load_tokenizer(str(work / "data-bin" / "ko"))
    for line in sentences[:20]:
        assert tokenizer.pieces(unicodedata.normalize("NFD", line)) == tokenizer.pieces(line)
    assert len(tokenizer.pieces(sentences[0])) < len(sentences[0].replace(" ", ""))

    # the pre-training log has the metrics, and the generator learns
    gen_acc = logged("gen_acc", train_log)
    assert len(gen_acc) == 6 and gen_acc[-1] > gen_acc[0], train_log[-3000:]
    assert all(0 <= v <= 1 for v in logged("disc_auc", train_log))
    assert all(0 <= v <= 100 for v in logged("replaced_frac", train_log))

    # the labelled set was converted (the empty review dropped) and the table has a median
    train_tsv = (work / "ko-sentiment" / "train.tsv").read_text(encoding="utf-8").splitlines()
    assert train_tsv[0] == "sentence\tlabel" and len(train_tsv) == len(sentences[::2]) + 1
    report = json.loads((work / "trials" / "ko-tiny" / "trials.json").read_text())
    (row,) = [r for r in report["rows"] if r["judges"]]  # an own task logs F1 and MCC beside
    assert (row["task"], row["metric"], len(row["scores"])) == ("nsmc", "accuracy", 2)
    assert 0 <= row["median"] <= 100
    assert "| median |" in (work / "trials" / "ko-tiny" / "trials.md").read_text()
