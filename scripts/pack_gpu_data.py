#!/usr/bin/env python
"""The data a lent GPU machine gets (benchmarks/gpu_session.sh, scripts/electra_vs_mlm.py): the
real English corpora of scripts/fetch_corpus.py joined into one pre-training corpus with a
vocabulary of ELECTRA-Small's size, and two sentiment tasks binarized with it.

    python scripts/pack_gpu_data.py --out-dir gpu_data   # data-bin, sentiment-bin, amazon-bin

The binarized ids are fairseq's memory-mapped uint16 files, the smallest form that travels
(the machine takes 64 MiB per call, the wheels included); the folder's size is printed last.
An existing --out-dir is refused unless --force.
"""

import argparse
import os
import shutil
import subprocess
import sys

from fetch_corpus import DOCUMENTS

from electra_plugin.cli.vocabulary import HelpFormatter
from electra_plugin.user_io.errors import ElectraUsageError, command_line

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
TASKS = {"sentiment": "movies", "amazon": "amazon"}  # task folder: fetch_sentiment --source


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode:
        raise ElectraUsageError(f"pack_gpu_data: {' '.join(cmd[:4])} ... failed (above)")


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--out-dir", default="gpu_data", help="the folder to write")
    p.add_argument("--corpora", nargs="+", default=sorted(DOCUMENTS), choices=sorted(DOCUMENTS),
                   help="the corpora (scripts/fetch_corpus.py) joined into the pre-training text")
    p.add_argument("--vocab-size", type=int, default=30522,
                   help="sentencepiece pieces (default: ELECTRA's 30522)")
    p.add_argument("--force", action="store_true", help="replace an existing --out-dir")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    out = os.path.abspath(args.out_dir)
    if os.path.exists(out):
        if not args.force:
            raise ElectraUsageError(f"--out-dir {args.out_dir} exists; pass --force to replace "
                                    f"it")
        shutil.rmtree(out)
    raw = os.path.join(out, "raw")
    os.makedirs(raw)
    corpus = os.path.join(raw, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as joined:
        for name in args.corpora:
            part = os.path.join(raw, f"{name}.txt")
            run([sys.executable, os.path.join(SCRIPTS, "fetch_corpus.py"), name, "--out", part])
            with open(part, encoding="utf-8") as f:
                shutil.copyfileobj(f, joined)
            joined.write("\n")  # the parts stay separate documents
    data = os.path.join(out, "data-bin")
    run([sys.executable, "-m", "electra_plugin.cli.prepare", "--train", corpus, "--out-dir",
         data, "--sentencepiece-vocab-size", str(args.vocab_size)])
    for task, source in TASKS.items():
        text = os.path.join(raw, task)
        run([sys.executable, os.path.join(SCRIPTS, "fetch_sentiment.py"), "--source", source,
             "--out-dir", text])
        run([sys.executable, "-m", "electra_plugin.cli.glue", "preprocess", "--task", "SST-2",
             "--glue-dir", text, "--pretrain-data", data, "--out-dir",
             os.path.join(out, f"{task}-bin")])
    shutil.rmtree(raw)
    print(f"{out}: {folder_bytes(out) / 2**20:.1f} MiB ({folder_bytes(data) / 2**20:.1f} MiB "
          f"of pre-training data)")


if __name__ == "__main__":
    command_line(main)
