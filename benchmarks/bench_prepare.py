#!/usr/bin/env python3
"""Encoding + binarizing speed of electra-prepare, against the path it replaced.

Both paths encode the same whitespace-normalised split (what electra-prepare writes before
encoding) with the same tokenizer:

  new   TextTokenizer.encode_ids in batches -> .bin/.idx (electra_plugin.data.binarize)
  old   the plugin's Python encoder line by line -> pieces text -> fairseq-preprocess

and must give byte-identical .bin/.idx. Tokenizer training is not timed (give a model).
Run with OMP_NUM_THREADS=1 and --threads 1 for per-core figures.

  OMP_NUM_THREADS=1 python benchmarks/bench_prepare.py --text corpus.txt \\
      --spm-model spm.model [--skip-old]
"""

import argparse
import os
import sys
import tempfile
import time

from electra_plugin.cli.prepare import copy_docs
from electra_plugin.data import tokenizer as tokmod
from electra_plugin.data.binarize import binarize_text, fairseq_preprocess


def old_path(raw, tokenizer, work, threads):
    """electra-prepare before: pieces text (lines without pieces dropped, an empty line per
    document break), then fairseq-preprocess."""
    pending = wrote = False
    with open(raw, encoding="utf-8") as f, \
            open(os.path.join(work, "train.pieces"), "w", encoding="utf-8") as out:
        for line in f:
            pieces = tokenizer.encode_line(line.rstrip("\n"))
            if not pieces:
                pending = wrote
                continue
            if pending:
                out.write("\n")
                pending = False
            out.write(pieces + "\n")
            wrote = True
    fairseq_preprocess(os.path.join(work, "old"), os.path.join(work, "dict.txt"),
                       {"trainpref": os.path.join(work, "train.pieces")}, threads)
    return os.path.join(work, "old", "train")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--text", nargs="+", required=True)
    voc = p.add_mutually_exclusive_group(required=True)
    voc.add_argument("--spm-model")
    voc.add_argument("--wordpiece-vocab")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-old", action="store_true", help="time the new path only")
    args = p.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
    if args.spm_model:
        tok = tokmod.SentencePieceTokenizer(args.spm_model)
    else:
        tok = tokmod.WordPieceTextTokenizer(args.wordpiece_vocab)
    dict_lines = tok.dict_lines()
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "dict.txt"), "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in dict_lines)
        raw = os.path.join(work, "raw.txt")
        copy_docs(args.text, raw)
        mb = os.path.getsize(raw) / 1e6
        start = time.time()
        stats = binarize_text(raw, os.path.join(work, "train"), tok, len(dict_lines) + 4,
                              args.threads)
        new = time.time() - start
        print(f"{tok.kind}, {mb:.1f} MB, {stats['pieces']} tokens, {stats['lines']} lines, "
              f"threads {args.threads}")
        print(f"new: {new:.1f} s, {stats['pieces'] / new / 1e6:.2f}M tokens/s")
        if args.skip_old:
            return
        start = time.time()
        ref = old_path(raw, tok, work, args.threads)
        old = time.time() - start
        print(f"old: {old:.1f} s, {stats['pieces'] / old / 1e6:.2f}M tokens/s; "
              f"new/old speed {old / new:.1f}x")
        same = all(open(ref + s, "rb").read() == open(os.path.join(work, "train") + s, "rb").read()
                   for s in (".bin", ".idx"))
        print(f"byte-identical .bin/.idx: {same}")
        if not same:
            sys.exit(1)


if __name__ == "__main__":
    main()
