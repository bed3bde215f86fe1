"""SQuAD for the ELECTRA plugin: split, preprocess, predict, evaluate.

(Real SQuAD-format data to try it on: ``python scripts/fetch_squad.py`` in a clone.)

Subcommands:
  split       cut a SQuAD file into train/valid files by paragraph (no context in both)
  preprocess  SQuAD JSON -> windows binarized for ``--task squad``, with the pre-training
              data directory's dict.txt and tokenizer
  predict     a fine-tuned checkpoint -> predictions.json (official format), nbest, EM/F1
  evaluate    the official EM/F1 of a predictions.json against a SQuAD JSON file

Example (see examples/squad/README.md for the whole recipe):
  electra-squad preprocess --pretrain-data data-bin/news --train train-v1.1.json \\
      --valid dev-v1.1.json --out-dir data-bin/squad
  fairseq-train data-bin/squad --user-dir electra_plugin --task squad --criterion squad ...
  electra-squad predict --checkpoint checkpoints/checkpoint_last.pt \\
      --data data-bin/squad --split valid --out-dir results
"""

import json
import logging
import os
import random
import shutil

from electra_plugin.cli.command import console, subcommands
from electra_plugin.cli.vocabulary import (add_json, command_parser, print_result,
                                           renamed, subcommand)
from electra_plugin.data import squad as sq
from electra_plugin.data import squad_answers
from electra_plugin.data.binarize import writable_destdir
from electra_plugin.data.dictionary import load_dictionary
from electra_plugin.finetuning.kinds import record_task
from electra_plugin.user_io.errors import ElectraUsageError
from electra_plugin.user_io.output_dir import refuse_existing
from electra_plugin.user_io.partial_output import removed_on_failure

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------ split
def split(args):
    """Paragraph-level train/valid split of one SQuAD file (questions stay with their text)."""
    sq.read_squad(args.input, realign=True)  # check it first
    with open(args.input, encoding="utf-8") as f:
        raw = json.load(f)
    paragraphs = [(a.get("title", ""), p) for a in raw["data"] for p in a["paragraphs"]]
    random.Random(args.seed).shuffle(paragraphs)
    total = sum(len(p["qas"]) for _, p in paragraphs)
    want_valid = max(1, round(args.valid_fraction * total))
    if args.max_valid_questions:
        want_valid = min(want_valid, args.max_valid_questions)
    parts = {"valid": [], "train": []}
    counts = {"valid": 0, "train": 0}
    for title, p in paragraphs:
        part = "valid" if counts["valid"] < want_valid else "train"
        if part == "train" and args.max_train_questions and \
                counts["train"] >= args.max_train_questions:
            break
        parts[part].append({"title": title, "paragraphs": [p]})
        counts[part] += len(p["qas"])
    if not counts["train"]:
        raise ElectraUsageError(f"{args.input} is too small to split (--valid-fraction "
                                f"{args.valid_fraction} takes every question)")
    os.makedirs(args.out_dir, exist_ok=True)
    for part, articles in parts.items():
        path = os.path.join(args.out_dir, f"{part}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"version": raw.get("version", ""), "data": articles}, f,
                      ensure_ascii=False)
        logger.info(f"{path}: {counts[part]} questions, {len(articles)} paragraphs")
    return 0


# ------------------------------------------------------------------------------- preprocess
def preprocess(args):
    with removed_on_failure(args.out_dir):  # a failed run leaves no output that looks whole
        return _preprocess(args)


def _preprocess(args):
    inputs = {name: path for name, path in (("train", args.train), ("valid", args.valid),
                                            ("test", args.test)) if path}
    if not inputs:
        raise ElectraUsageError("give at least one of --train, --valid, --test")
    sq.check_window_sizes(args.max_seq_len, args.doc_stride, args.max_query_len)
    pretrain = args.pretrain_data
    dictionary = load_dictionary(pretrain)
    # Read and check every file before the slow part.
    data = {name: sq.read_squad(path, args.squad_version, args.realign_answers,
                                labelled=True if name != "test" else None)
            for name, path in inputs.items()}
    versions = {d.version for d in data.values() if d.labelled}
    if "test" in data and not data["test"].labelled:  # questions alone: the others' version
        data["test"].version = args.squad_version or next(iter(versions), "1.1")
    if len(versions) > 1:
        raise ElectraUsageError(f"the files are of different SQuAD versions ({sorted(versions)}"
                                f"); pass --squad-version")
    for name, d in data.items():
        logger.info(f"{name}: {inputs[name]}: SQuAD {d.version}, {len(d.examples)} questions, "
                    f"{len(d.contexts)} paragraphs"
                    + (f", {d.realigned} answers realigned" if d.realigned else ""))

    from electra_plugin.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(pretrain)
    dest = args.out_dir
    writable_destdir(dest)  # a read-only destination: one line before any work
    if refuse_existing(dest, args.force, lambda name: name.endswith(".squad.json")):
        for name in os.listdir(dest):  # --force: this command's files of the earlier run
            if name.endswith((".squad.json", ".input.bin", ".input.idx", ".target.bin",
                              ".target.idx")):
                os.remove(os.path.join(dest, name))
    # The data directory carries its dictionary and tokenizer, so it stands on its own.
    if not os.path.samefile(pretrain, dest):
        shutil.copyfile(os.path.join(pretrain, "dict.txt"), os.path.join(dest, "dict.txt"))
        tokenizer.save_to(dest)

    for name, d in data.items():
        windows, offsets, stats = sq.make_windows(
            d, tokenizer, dictionary, args.max_seq_len, args.doc_stride, args.max_query_len)
        sq.write_split(dest, name, d, windows, offsets, len(dictionary),
                       args.max_seq_len, args.doc_stride, args.max_query_len,
                       source=os.path.abspath(inputs[name]))
        unk = sum(t == dictionary.unk() for w in windows for t in w.tokens)
        logger.info(f"{name}: {stats['windows']} windows ({stats['windows without the answer']} without "
                    f"an answer), {stats['questions truncated']} questions cut to --max-query-len, "
                    f"{stats['answers covering no piece']} answers that cover no piece, "
                    f"{unk} <unk> tokens")
    record_task("squad", dest)
    logger.info(f"done: {os.path.abspath(dest)}")
    return 0


# ---------------------------------------------------------------------------------- predict
def predict(args):
    from electra_plugin.finetuning.evaluate import squad_predictions

    preds, meta = squad_predictions(
        args.checkpoint, args.data, args.split, args.cpu, n_best_size=args.n_best_size,
        max_answer_len=args.max_answer_len, no_answer_threshold=args.no_answer_threshold,
        batch_size=args.batch_size)
    answers = {qid: p.answer for qid, p in preds.items()}
    os.makedirs(args.out_dir, exist_ok=True)
    outputs = {"predictions.json": answers,
               "nbest_predictions.json": {qid: p.nbest for qid, p in preds.items()}}
    null_scores = {qid: p.no_answer_score for qid, p in preds.items()
                   if p.no_answer_score is not None}
    if null_scores:
        outputs["null_odds.json"] = null_scores
    scores = None
    if meta.labelled:
        scores = squad_answers.squad_scores(meta.examples, answers, null_scores,
                                 {qid: p.best_span for qid, p in preds.items()})
        outputs["eval.json"] = scores
    for name, value in outputs.items():
        with open(os.path.join(args.out_dir, name), "w", encoding="utf-8") as f:
            json.dump(value, f, indent=1 if name == "eval.json" else None, ensure_ascii=False)
    logger.info(f"wrote {', '.join(outputs)} to {args.out_dir}"
                + ("" if scores else f" ({args.split} has no gold answers: not scored)"))
    if scores:
        print_result(scores, args.json, f"SQuAD {args.split}")
    return 0


# --------------------------------------------------------------------------------- evaluate
def evaluate(args):
    data = sq.read_squad(args.data_file, args.squad_version, realign=True)
    try:
        with open(args.pred_file, encoding="utf-8") as f:
            predictions = json.load(f)
    except (OSError, ValueError) as e:
        raise ElectraUsageError(f"cannot read predictions {args.pred_file}: {e}")
    if not isinstance(predictions, dict) or not all(isinstance(v, str)
                                                    for v in predictions.values()):
        raise ElectraUsageError(f"{args.pred_file} is not a predictions.json (question id -> "
                                f"answer text)")
    missing = sum(ex.qid not in predictions for ex in data.examples)
    if missing:
        logger.info(f"{missing} questions have no prediction and score 0")
    print_result(squad_answers.squad_scores(data.examples, predictions), args.json,
                 os.path.basename(args.pred_file))
    return 0


# ------------------------------------------------------------------------------------- main
def build_parser():
    p = command_parser("electra-squad", __doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = subcommand(sub, "split", "paragraph-level train/valid split of one SQuAD file")
    s.add_argument("input", help="SQuAD JSON file")
    s.add_argument("--out-dir", required=True, help="writes train.json and valid.json here")
    s.add_argument("--valid-fraction", type=float, default=0.1,
                   help="fraction of the questions held out (default 0.1)")
    s.add_argument("--max-valid-questions", type=int, help="hold out at most this many")
    s.add_argument("--max-train-questions", type=int, help="keep at most about this many "
                                                           "training questions (whole paragraphs)")
    s.add_argument("--seed", type=int, default=1, help="shuffling seed (default 1)")
    s.set_defaults(run=split)

    pp = subcommand(sub, "preprocess", "SQuAD JSON -> binarized windows for --task squad")
    pp.add_argument("--pretrain-data", required=True,
                    help="pre-training data directory (dict.txt and the tokenizer "
                         "electra-prepare saved)")
    pp.add_argument("--train", help="training SQuAD JSON file")
    pp.add_argument("--valid", help="validation SQuAD JSON file (e.g. the dev set)")
    pp.add_argument("--test", help="another SQuAD JSON file to predict on; without any "
                                   "answers (a test set) it is predicted but not scored")
    pp.add_argument("--out-dir", required=True, help="output directory")
    pp.add_argument("--squad-version", choices=sq.VERSIONS,
                    help="default: 2.0 if the files have is_impossible fields, else 1.1")
    pp.add_argument("--max-seq-len", type=int, default=sq.MAX_SEQ_LEN,
                    help=f"tokens per window, specials included; at most the model's "
                         f"--max-positions (default {sq.MAX_SEQ_LEN}, ELECTRA's)")
    pp.add_argument("--doc-stride", type=int, default=sq.DOC_STRIDE,
                    help=f"context pieces between window starts (default {sq.DOC_STRIDE})")
    pp.add_argument("--max-query-len", type=int, default=sq.MAX_QUERY_LEN,
                    help=f"question pieces kept (default {sq.MAX_QUERY_LEN})")
    pp.add_argument("--realign-answers", action="store_true",
                    help="move an answer whose text is not at its answer_start to the nearest "
                         "occurrence of the text (released SQuAD files have a few)")
    pp.add_argument("--force", action="store_true", help="overwrite SQuAD data in --out-dir")
    renamed(pp, "--destdir", "--out-dir")
    pp.set_defaults(run=preprocess)

    pr = subcommand(sub, "predict", "checkpoint -> predictions.json and EM/F1")
    pr.add_argument("--checkpoint", required=True, help="a checkpoint of --task squad")
    pr.add_argument("--data", help="preprocessed SQuAD directory (default: the checkpoint's)")
    pr.add_argument("--split", default="valid", help="split to predict (default valid)")
    pr.add_argument("--out-dir", required=True,
                    help="writes predictions.json, nbest_predictions.json, null_odds.json "
                         "(2.0) and eval.json")
    pr.add_argument("--n-best-size", type=int, default=squad_answers.N_BEST_SIZE,
                    help="start and end candidates per window (default %(default)s)")
    pr.add_argument("--max-answer-len", type=int, default=squad_answers.MAX_ANSWER_LEN,
                    help="longest answer in pieces (default %(default)s)")
    pr.add_argument("--no-answer-threshold", type=float, default=0.0,
                    help="SQuAD 2.0: answer \"\" when the no-answer logit exceeds this "
                         "(default 0; eval.json's best_f1_thresh is the best value on this split)")
    pr.add_argument("--batch-size", type=int, default=32, help="windows per batch")
    add_json(pr)
    pr.add_argument("--cpu", action="store_true", help="do not use a GPU")
    pr.set_defaults(run=predict)

    e = subcommand(sub, "evaluate", "official EM/F1 of a predictions.json")
    e.add_argument("data_file", help="SQuAD JSON file with the gold answers")
    e.add_argument("pred_file", help="predictions.json (question id -> answer text)")
    e.add_argument("--squad-version", choices=sq.VERSIONS,
                   help="default: detected from the file")
    add_json(e)
    e.set_defaults(run=evaluate)
    return p


main = subcommands(build_parser)
cli = console(main)


if __name__ == "__main__":
    cli()
