#!/usr/bin/env python
"""Official GLUE TSVs -> fairseq binarized input0/ input1/ label/ for sentence_prediction.

Text is tokenized with the pre-training data directory's tokenizer and binarized with its
dict.txt, so the fine-tuning dictionary is the checkpoint's. Sentence pairs are cut longest
first to fit ``--max-seq-len`` tokens with ``<s> A </s> B </s>``, as the official code does.

    python scripts/glue_preprocess.py --task RTE --glue-dir glue_data/RTE \
        --pretrain-data data-bin/news --destdir data-bin/RTE
"""

import argparse
import os
import sys
import tempfile

from electra_plugin.data.binarize import check_destdir, fairseq_preprocess
from electra_plugin.data.tokenizer import load_tokenizer
from electra_plugin.errors import ElectraUsageError, command_line
from electra_plugin.glue import get_task, read_split

MAX_POSITIONS = 512


def log(message):
    print(f"[glue_preprocess] {message}", file=sys.stderr, flush=True)


def fit_pair(pieces, max_tokens):
    """Drop pieces from the end of the longest sentence until the total fits."""
    pieces = [list(p) for p in pieces]
    cut = False
    while sum(len(p) for p in pieces) > max_tokens:
        longest = max(pieces, key=len)
        longest.pop()
        cut = True
    return pieces, cut


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", required=True, help="GLUE task name, e.g. RTE, MNLI, STS-B")
    p.add_argument("--glue-dir", required=True,
                   help="the task's directory in the official layout (train.tsv, dev.tsv ...)")
    p.add_argument("--pretrain-data", required=True,
                   help="pre-training data directory (dict.txt + tokenizer from prepare_data.py)")
    p.add_argument("--destdir", required=True)
    p.add_argument("--max-seq-len", type=int, default=128,
                   help="tokens per example with <s> and </s> (official GLUE: 128)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--force", action="store_true", help="write into a non-empty --destdir")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    task = get_task(args.task)
    if not 4 <= args.max_seq_len <= MAX_POSITIONS:
        raise ElectraUsageError(f"--max-seq-len {args.max_seq_len} must be between 4 and "
                                f"{MAX_POSITIONS}, the model's positions")
    srcdict = os.path.join(args.pretrain_data, "dict.txt")
    if not os.path.isfile(srcdict):
        raise ElectraUsageError(f"{srcdict} is missing; --pretrain-data must be the directory "
                                f"the checkpoint was pre-trained on")
    tokenizer = load_tokenizer(args.pretrain_data)
    check_destdir(args.destdir, args.force)

    # fairseq names: train, valid (valid1 ... for MNLI's second dev set), test
    splits = [("train", "train", True)]
    splits += [(name, "valid" + (str(i) if i else ""), True)
               for i, name in enumerate(task.dev_splits)]
    test = "test_matched" if task.name == "MNLI" else "test"
    if os.path.isfile(os.path.join(args.glue_dir, f"{test}.tsv")):
        splits.append((test, "test", False))

    budget = args.max_seq_len - 1 - len(task.text_columns)  # <s> and one </s> per sentence
    with tempfile.TemporaryDirectory() as work:
        prefixes = {}
        for glue_name, fairseq_name, labelled in splits:
            sentences, labels = read_split(task, os.path.join(args.glue_dir, f"{glue_name}.tsv"),
                                           labelled)
            outs = [open(os.path.join(work, f"{fairseq_name}.input{i}"), "w", encoding="utf-8")
                    for i in range(len(task.text_columns))]
            truncated = 0
            for texts in sentences:
                pieces, cut = fit_pair([tokenizer.pieces(t) for t in texts], budget)
                truncated += cut
                for out, p in zip(outs, pieces):
                    out.write(" ".join(p) + "\n")
            for out in outs:
                out.close()
            if labels is not None:
                with open(os.path.join(work, f"{fairseq_name}.label"), "w") as f:
                    f.write("\n".join(labels) + "\n")
            prefixes[fairseq_name] = labelled
            log(f"{glue_name}: {len(sentences)} examples, {truncated} cut to "
                f"{args.max_seq_len} tokens")

        def option_prefixes(suffix, labelled_only=False):
            opts = {}
            valid = [n for n in prefixes if n.startswith("valid")]
            if "train" in prefixes:
                opts["trainpref"] = os.path.join(work, f"train.{suffix}")
            if valid:
                opts["validpref"] = ",".join(os.path.join(work, f"{n}.{suffix}") for n in valid)
            if "test" in prefixes and not labelled_only:
                opts["testpref"] = os.path.join(work, f"test.{suffix}")
            return opts

        for i in range(len(task.text_columns)):
            fairseq_preprocess(os.path.join(args.destdir, f"input{i}"), srcdict,
                               option_prefixes(f"input{i}"), args.workers, log)
        label_dir = os.path.join(args.destdir, "label")
        if task.labels is None:  # regression: sentence_prediction reads raw label files
            os.makedirs(label_dir, exist_ok=True)
            for name, labelled in prefixes.items():
                if labelled:
                    os.replace(os.path.join(work, f"{name}.label"),
                               os.path.join(label_dir, f"{name}.label"))
        else:  # a fixed label order, so that class i is task.labels[i]
            label_dict = os.path.join(work, "label.dict.txt")
            with open(label_dict, "w") as f:
                f.writelines(f"{label} 1\n" for label in task.labels)
            fairseq_preprocess(label_dir, label_dict, option_prefixes("label", True),
                               args.workers, log)
    tokenizer.save_to(args.destdir)  # the hub interface encodes text with it
    log(f"wrote {args.destdir} ({task.name}, {task.num_classes} "
        f"{'output' if task.labels is None else 'classes'})")


if __name__ == "__main__":
    command_line(main)
