"""GLUE for the plugin: preprocess the official TSVs and evaluate a fine-tuned checkpoint.

Subcommands:
  preprocess  official GLUE TSVs -> fairseq binarized input0/ input1/ label/ for
              sentence_prediction. Text is tokenized with the pre-training data directory's
              tokenizer and binarized with its dict.txt, so the fine-tuning dictionary is the
              checkpoint's. Sentence pairs are cut longest first to fit ``--max-seq-len``
              tokens with ``<s> A </s> B </s>``, as the official code does.
  evaluate    a fine-tuned checkpoint's official GLUE metric(s) on binarized dev data

Fine-tuning itself is fairseq-hydra-train with a task's config of examples/glue/config/
(glue.yaml holds ELECTRA's recipe, each task's file what the task changes, size/ the size's
lr and layer-wise lr decay).

Examples:
  electra-glue preprocess --task RTE --glue-dir glue_data/RTE \\
      --pretrain-data data-bin/news --out-dir data-bin/RTE
  electra-glue evaluate --task RTE --checkpoint ck/checkpoint_best.pt \\
      --data data-bin/RTE [--split valid] [--out predictions.txt] [--json] [--cpu]
"""

import argparse
import json
import logging
import os
import tempfile

from electra_plugin.cli.command import console, subcommands
from electra_plugin.cli.vocabulary import (add_json, command_parser, print_result,
                                           renamed, subcommand)
from electra_plugin.data.binarize import MAX_SEQ_LEN, fairseq_preprocess
from electra_plugin.data.dictionary import load_dictionary
from electra_plugin.data.glue import (GLUE_TASKS, TEST_OUTPUTS, GlueTask, get_task,
                                      numbered_rows, read_ids, read_split, score)
from electra_plugin.data.tokenizer import load_tokenizer
from electra_plugin.finetuning.evaluate import sentence_predictions
from electra_plugin.finetuning.kinds import read_task_file, record_task
from electra_plugin.finetuning.kinds.sentence import glue_task, own_metrics
from electra_plugin.user_io.errors import ElectraUsageError
from electra_plugin.user_io.output_dir import refuse_existing
from electra_plugin.user_io.partial_output import removed_on_failure


# ------------------------------------------------------------------------------ preprocess
logger = logging.getLogger(__name__)
GLUE_NAMES = {spelling for task in GLUE_TASKS.values()
              for spelling in (task.name, task.name.lower(), task.name.replace("-", ""),
                               task.name.lower().replace("-", ""))}


def fit_pair(pieces, max_tokens):
    """Drop pieces from the end of the longest sentence until the total fits."""
    pieces = [list(p) for p in pieces]
    cut = False
    while sum(len(p) for p in pieces) > max_tokens:
        longest = max(pieces, key=len)
        longest.pop()
        cut = True
    return pieces, cut


def test_file(args, test):
    """The TSV of an unlabelled split, or None when the task's directory lacks it (the
    diagnostic set may also sit in the official layout's diagnostic/ beside it)."""
    if test.tsv == "diagnostic" and args.diagnostic:
        if not os.path.isfile(args.diagnostic):
            raise ElectraUsageError(f"--diagnostic {args.diagnostic} is not a file")
        return args.diagnostic
    places = [os.path.join(args.glue_dir, f"{test.tsv}.tsv")]
    if test.tsv == "diagnostic":
        places.append(os.path.join(args.glue_dir, os.pardir, "diagnostic", "diagnostic.tsv"))
    return next((p for p in places if os.path.isfile(p)), None)


def preprocess(args):
    with removed_on_failure(args.out_dir):  # a failed run leaves no output that looks whole
        return _preprocess(args)


def own_task(args) -> GlueTask:
    """A user's own sentence task in GLUE's layout (train.tsv, dev.tsv): its columns from the
    options, its classes from the training file (sorted) unless --regression."""
    if args.text_columns is None:
        raise ElectraUsageError(
            f"--task {args.task} is not a GLUE task (CoLA, SST-2, MRPC, QQP, STS-B, MNLI, QNLI, "
            f"RTE, WNLI); for a task of your own give --text-columns (e.g. 0, or 0,1 for "
            f"pairs) and --label-column (default -1, the last), and --regression for scores")
    try:
        columns = tuple(int(c) for c in args.text_columns.split(","))
    except ValueError:
        raise ElectraUsageError(f"--text-columns {args.text_columns!r} is not column numbers "
                                f"(0-based, comma-separated: 0 or 0,1)") from None
    if not 1 <= len(columns) <= 2:
        raise ElectraUsageError(f"--text-columns {args.text_columns}: give one column or a pair")
    shape = GlueTask(args.task, columns, args.label_column, None, ("pearson",), 0,
                     header=args.header)
    labels = None
    if not args.regression:
        train = os.path.join(args.glue_dir, "train.tsv")
        labels = set()
        for number, row in numbered_rows(shape, train):
            label = row[args.label_column].strip()
            if not label:
                raise ElectraUsageError(f"{train}:{number}: the label (column "
                                        f"{args.label_column}) is empty; every row needs one")
            if len(label.split()) > 1:  # fairseq's label dictionary holds single tokens
                raise ElectraUsageError(
                    f"{train}:{number}: label {label!r} is more than one word; write each "
                    f"class as one (e.g. {'_'.join(label.split())})")
            labels.add(label)
        labels = tuple(sorted(labels))
        if len(labels) < 2:
            raise ElectraUsageError(f"{args.glue_dir}/train.tsv has {len(labels)} label(s) in "
                                    f"column {args.label_column}; a classification task needs "
                                    f"two or more (or give --regression)")
    return GlueTask(args.task, columns, args.label_column, labels, own_metrics(labels), 0,
                    header=args.header)


def _preprocess(args):
    task = get_task(args.task) if args.task in GLUE_NAMES else own_task(args)
    if not 4 <= args.max_seq_len <= MAX_SEQ_LEN:
        raise ElectraUsageError(f"--max-seq-len {args.max_seq_len} must be between 4 and "
                                f"{MAX_SEQ_LEN} (and at most the model's --max-positions)")
    load_dictionary(args.pretrain_data)  # its one error for a missing or malformed dict.txt
    srcdict = os.path.join(args.pretrain_data, "dict.txt")
    tokenizer = load_tokenizer(args.pretrain_data)
    refuse_existing(args.out_dir, args.force)

    # fairseq names: train, valid (valid1 ... for MNLI's second dev set), test (test1 ...)
    splits = [("train", "train", None)]
    splits += [(name, "valid" + (str(i) if i else ""), None)
               for i, name in enumerate(task.dev_splits)]
    tests = [t for t in task.test_splits if test_file(args, t)]
    splits += [(t.tsv, "test" + (str(i) if i else ""), t) for i, t in enumerate(tests)]
    double = task.double_unordered if args.double_unordered is None else args.double_unordered
    if double and len(task.text_columns) != 2:
        raise ElectraUsageError(f"--double-unordered needs sentence pairs; {task.name} has "
                                f"single sentences")

    budget = args.max_seq_len - 1 - len(task.text_columns)  # <s> and one </s> per sentence
    test_outputs = {}
    with tempfile.TemporaryDirectory() as work:
        prefixes = {}
        for glue_name, fairseq_name, test in splits:
            path = test_file(args, test) if test else os.path.join(args.glue_dir,
                                                                   f"{glue_name}.tsv")
            sentences, labels = read_split(task, path, test is None, test)
            if fairseq_name == "train" and double:  # each pair also in the other order
                sentences, labels = sentences + [p[::-1] for p in sentences], labels * 2
            if test:
                test_outputs[fairseq_name] = {"server_file": test.server_file,
                                              "ids": read_ids(test, path)}
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
            prefixes[fairseq_name] = test is None
            logger.info(f"{glue_name}: {len(sentences)} examples"
                        f"{' (both orders)' if fairseq_name == 'train' and double else ''}, "
                        f"{truncated} cut to {args.max_seq_len} tokens")

        def option_prefixes(suffix, labelled_only=False):
            opts = {}
            valid = [n for n in prefixes if n.startswith("valid")]
            if "train" in prefixes:
                opts["trainpref"] = os.path.join(work, f"train.{suffix}")
            if valid:
                opts["validpref"] = ",".join(os.path.join(work, f"{n}.{suffix}") for n in valid)
            tests = [n for n in prefixes if n.startswith("test")]
            if tests and not labelled_only:
                opts["testpref"] = ",".join(os.path.join(work, f"{n}.{suffix}") for n in tests)
            return opts

        for i in range(len(task.text_columns)):
            fairseq_preprocess(os.path.join(args.out_dir, f"input{i}"), srcdict,
                               option_prefixes(f"input{i}"), args.workers, logger.info)
        label_dir = os.path.join(args.out_dir, "label")
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
                               args.workers, logger.info)
    tokenizer.save_to(args.out_dir)  # the hub interface encodes text with it
    if test_outputs:  # what electra-finetune test-outputs names its predictions by
        with open(os.path.join(args.out_dir, TEST_OUTPUTS), "w") as f:
            json.dump({"task": task.name, "splits": test_outputs}, f)
    record_task("sentence", args.out_dir, task.name)
    logger.info(f"wrote {args.out_dir} ({task.name}, {task.num_classes} "
                f"{'output' if task.labels is None else 'classes'})")


# -------------------------------------------------------------------------------- evaluate
def evaluate(args):
    """Prints the metrics and returns them."""
    glue_task = get_task(args.task) if args.task in GLUE_NAMES else recorded_task(args)
    preds, gold = sentence_predictions(args.checkpoint, args.data, [args.split],
                                       args.cpu)[args.split]
    if gold is None:
        raise ElectraUsageError(
            f"the {args.split} split of {args.data} has no labels to score; write its "
            f"predictions for the benchmark's server with electra-finetune test-outputs")
    results = score(glue_task, preds, gold)
    if args.out:
        with open(args.out, "w") as f:
            for value in preds:
                f.write(f"{value:.6f}\n" if glue_task.labels is None
                        else glue_task.labels[value] + "\n")
    print_result({"task": glue_task.name, "split": args.split, "n": len(gold), **results},
                 args.json, f"{glue_task.name} {args.split}")
    return results


def recorded_task(args) -> GlueTask:
    """A task of one's own, as its preprocessing recorded it in the data directory."""
    prepared = read_task_file(args.data)
    if prepared is None or prepared.kind != "sentence":
        raise ElectraUsageError(f"--task {args.task} is not a GLUE task, and {args.data} records "
                                f"no sentence task of its own; preprocess it with electra-glue "
                                f"preprocess --task {args.task} --text-columns ...")
    return glue_task(prepared)


# ------------------------------------------------------------------------------------ main
def build_parser():
    p = command_parser("electra-glue", __doc__)
    sub = p.add_subparsers(dest="command", required=True)

    pp = subcommand(sub, "preprocess", "GLUE TSVs -> binarized data for sentence_prediction")
    pp.add_argument("--task", required=True,
                    help="GLUE task name (RTE, MNLI, STS-B ...), or your own task's name with "
                         "--text-columns")
    pp.add_argument("--text-columns", help="your own task: the 0-based column(s) of its text "
                                           "in train.tsv and dev.tsv (0, or 0,1 for pairs)")
    pp.add_argument("--label-column", type=int, default=-1,
                    help="your own task: the label's column (default -1, the last)")
    pp.add_argument("--regression", action="store_true",
                    help="your own task: the label is a score (judged by Pearson/Spearman)")
    pp.add_argument("--header", action=argparse.BooleanOptionalAction, default=True,
                    help="your own task: whether the TSVs start with a header line")
    pp.add_argument("--glue-dir", required=True,
                    help="the task's directory in the official layout (train.tsv, dev.tsv ...)")
    pp.add_argument("--pretrain-data", required=True,
                    help="pre-training data directory (dict.txt + tokenizer from electra-prepare)")
    pp.add_argument("--out-dir", required=True, help="writes the binarized task here")
    pp.add_argument("--max-seq-len", type=int, default=128,
                    help="tokens per example with <s> and </s> (official GLUE: 128)")
    pp.add_argument("--double-unordered", action=argparse.BooleanOptionalAction,
                    help="train also on each sentence pair in the other order (default: as "
                         "the official code, on for MRPC and STS-B)")
    pp.add_argument("--diagnostic", help="MNLI: the GLUE diagnostic (AX) TSV, predicted by "
                                         "the MNLI model (default: GLUE_DIR/diagnostic.tsv or "
                                         "GLUE_DIR/../diagnostic/diagnostic.tsv)")
    pp.add_argument("--workers", type=int, default=1, help="binarizing processes")
    pp.add_argument("--force", action="store_true", help="write into a non-empty --out-dir")
    renamed(pp, "--destdir", "--out-dir")
    pp.set_defaults(run=preprocess)

    ev = subcommand(sub, "evaluate", "a fine-tuned checkpoint's GLUE metric(s)")
    ev.add_argument("--task", required=True, help="GLUE task name (picks the metric)")
    ev.add_argument("--checkpoint", required=True, help="fine-tuned checkpoint")
    ev.add_argument("--data", required=True, help="output of electra-glue preprocess")
    ev.add_argument("--split", default="valid", help="valid, valid1 (MNLI mismatched) ...")
    ev.add_argument("--out", help="write one prediction per line here")
    add_json(ev)
    ev.add_argument("--cpu", action="store_true",
                    help="run on the CPU (default: the GPU when there is one)")
    renamed(ev, "--predictions", "--out")
    ev.set_defaults(run=evaluate)

    return p


main = subcommands(build_parser)
cli = console(main)


if __name__ == "__main__":
    cli()
