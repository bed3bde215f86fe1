"""Token tagging (NER, chunking, POS) for the plugin: preprocess CoNLL files, predict.

Subcommands:
  finetune    CoNLL files and a pre-trained checkpoint -> a fine-tuned tagger and its dev
              entity F1 (per type too), in one command: preprocess, one fairseq-train run
              with the official recipe (the size's lr and layer-wise lr decay, 10% warm-up,
              linear decay, 3 epochs), predict the dev file
  preprocess  CoNLL files (a word per line, its label in the last column, a blank line
              between sentences) -> binarized data for ``--task token_tagging``: each word's
              pieces under the pre-training data's tokenizer, its label on the first piece
  predict     a fine-tuned checkpoint -> the split as CoNLL columns (word, gold, predicted)
              and its scores: entity F1/precision/recall (seqeval) for BIO/BIOES labels,
              token accuracy always

A CoNLL file is a word per line with its label in the last column (tabs or spaces, Windows
line ends, -DOCSTART- lines all read), a blank line between sentences.

Examples:
  electra-tag finetune --checkpoint ck/checkpoint_last.pt --train train.conll \\
      --valid dev.conll --out-dir ner-run
  electra-tag preprocess --pretrain-data data-bin/news --train train.conll \\
      --valid dev.conll --out-dir data-bin/ner
  electra-tag predict --checkpoint ner-run/run/checkpoint_last.pt --data data-bin/ner \\
      --split valid --out valid.predictions.conll
"""

import argparse
import json
import logging
import os
import shlex
import shutil

from electra_plugin.cli.command import console, subcommands
from electra_plugin.cli.vocabulary import (add_json, command_parser, print_result,
                                           renamed, subcommand)
from electra_plugin.data import conll
from electra_plugin.data.binarize import MAX_SEQ_LEN, writable_destdir
from electra_plugin.data.dictionary import load_dictionary
from electra_plugin.data.tokenizer import load_tokenizer
from electra_plugin.finetuning.kinds import record_task
from electra_plugin.user_io.errors import ElectraUsageError
from electra_plugin.user_io.output_dir import refuse_existing
from electra_plugin.user_io.partial_output import removed_on_failure, written_whole

logger = logging.getLogger(__name__)


def preprocess(args):
    inputs = {name: path for name, path in (("train", args.train), ("valid", args.valid),
                                            ("test", args.test)) if path}
    if "train" not in inputs:
        raise ElectraUsageError("give --train (its labels are the model's)")
    if not 4 <= args.max_seq_len <= MAX_SEQ_LEN:
        raise ElectraUsageError(f"--max-seq-len {args.max_seq_len} must be between 4 and "
                                f"{MAX_SEQ_LEN} (and at most the model's --max-positions)")
    dictionary = load_dictionary(args.pretrain_data)
    tokenizer = load_tokenizer(args.pretrain_data)
    data = {name: conll.read_conll(path) for name, path in inputs.items()}
    labels = conll.label_list(data["train"])
    with removed_on_failure(args.out_dir):  # the directory too, when this run made it
        writable_destdir(args.out_dir)
        refuse_existing(args.out_dir, args.force)
        shutil.copyfile(os.path.join(args.pretrain_data, "dict.txt"),
                        os.path.join(args.out_dir, "dict.txt"))
        tokenizer.save_to(args.out_dir)
        with open(os.path.join(args.out_dir, conll.LABELS_FILE), "w", encoding="utf-8") as f:
            f.write("\n".join(labels) + "\n")
        for name, sentences in data.items():
            encoded = [conll.encode(s, tokenizer, dictionary, labels, args.max_seq_len,
                                    f"{inputs[name]}, sentence {i + 1}")
                       for i, s in enumerate(sentences)]
            write_split(args.out_dir, name, encoded, len(dictionary))
            conll.save_metadata(args.out_dir, name, sentences, encoded, labels,
                                os.path.abspath(inputs[name]))
            cut = sum(0 in e.first_pieces for e in encoded)
            logger.info(f"{name}: {len(sentences)} sentences, "
                        f"{sum(len(s.words) for s in sentences)} words, {cut} sentences cut "
                        f"to {args.max_seq_len} tokens")
        record_task("tagging", args.out_dir)
    logger.info(f"wrote {args.out_dir}: {len(labels)} labels ({' '.join(labels)})")


def finetune(args):
    """preprocess -> one trial (trials' command builder, the official recipe) -> predict;
    prints the dev scores and each entity type's, and writes the dev predictions. A re-run
    resumes the fine-tuning, or reports the finished one."""
    from electra_plugin.finetuning import trials as tr

    start = tr.from_checkpoint(args.checkpoint)
    data = os.path.join(args.out_dir, "data")
    if not os.path.isfile(os.path.join(data, "finetuning_task.json")):
        pretrain = args.pretrain_data or start.pretraining_data
        if pretrain is None:
            raise ElectraUsageError(f"--checkpoint {args.checkpoint} records no pre-training "
                                    f"data; give --pretrain-data (its dict.txt and tokenizer)")
        check_pretrain_data(args.pretrain_data, start)
        preprocess(argparse.Namespace(
            train=args.train, valid=args.valid, test=None, pretrain_data=pretrain,
            out_dir=data, max_seq_len=args.max_seq_len, force=False))
    else:
        check_same_inputs(data, {"train": args.train, "valid": args.valid})
    recipe = tr.Recipe(lr=args.lr, layer_decay=args.layer_decay, epochs=args.epochs,
                       batch_size=args.batch_size, cpu=args.cpu, keep=args.keep,
                       extra=tuple(args.fairseq_options))
    trial, = tr.plan([tr.parse_task(f"{args.name}={data}")], start, [args.seed],
                     args.out_dir, recipes={args.name: recipe})
    result, = tr.run_trials([trial], recipe)
    scores = dict(result["scores"][args.name])
    predicted = os.path.join(args.out_dir, "valid.predictions.conll")
    predict(argparse.Namespace(checkpoint=os.path.join(trial.save_dir, recipe.checkpoint),
                               data=data, split="valid", out=predicted, json=False,
                               cpu=args.cpu, quiet=True))
    types = result["details"][args.name].get("per_type", {})
    for kind, found in types.items():
        print(f"  {kind:<12} precision {found['precision']:6.2f}  recall "
              f"{found['recall']:6.2f}  f1 {found['f1']:6.2f}  ({found['support']} entities)")
    print_result({"split": "valid", **scores, "per_type": types, "model": os.path.join(
        trial.save_dir, recipe.checkpoint)}, args.json, f"{args.name} dev")
    return scores


def check_pretrain_data(pretrain_data, start):
    """A --pretrain-data of another dictionary than the checkpoint's is refused before its
    data is written: the fine-tuning would read scrambled token ids."""
    from electra_plugin.finetuning import trials as tr

    if pretrain_data is None:
        return  # the checkpoint's own
    load_dictionary(pretrain_data)  # its one line for a missing or malformed dict.txt
    problem = tr.dictionary_problem(os.path.join(pretrain_data, "dict.txt"), start)
    if problem is not None:
        raise ElectraUsageError(f"--pretrain-data {pretrain_data}: {problem}; give the "
                                f"checkpoint's pre-training data, or leave --pretrain-data out "
                                f"to read it from the checkpoint ({start.pretraining_data})")


def check_same_inputs(data, inputs):
    """A re-run reads the CoNLL files the first one preprocessed (else one line)."""
    for split, path in inputs.items():
        with open(conll.metadata_path(data, split), encoding="utf-8") as f:
            source = json.load(f).get("source")
        if source != os.path.abspath(path):
            raise ElectraUsageError(f"{data} holds {split} data preprocessed from {source}, not "
                                    f"{path}; give another --out-dir")


def write_split(data_dir, split, encoded, vocab_size):
    """Pieces and targets with fairseq's indexed-dataset builders (targets as int32, -1
    where nothing is predicted)."""
    import numpy as np
    import torch
    from fairseq.data import indexed_dataset

    prefix = os.path.join(data_dir, split)
    tokens = indexed_dataset.make_builder(prefix + ".input.bin", "mmap", vocab_size=vocab_size)
    targets = indexed_dataset.MMapIndexedDatasetBuilder(prefix + ".target.bin", dtype=np.int32)
    for e in encoded:
        tokens.add_item(torch.IntTensor(e.tokens))
        targets.add_item(torch.IntTensor(e.targets))
    tokens.finalize(prefix + ".input.idx")
    targets.finalize(prefix + ".target.idx")


def predict(args):
    from electra_plugin.finetuning.evaluate import tagging_predictions

    sentences, predicted, labels = tagging_predictions(args.checkpoint, args.data, args.split,
                                                       args.cpu)
    scores = conll.tagging_scores([s.labels for s in sentences], predicted, labels)
    if args.out:
        with written_whole(args.out) as partial:
            conll.write_conll(partial, sentences, predicted)
        logger.info(f"wrote {args.out}")
    if not getattr(args, "quiet", False):
        print_result({"split": args.split, "sentences": len(sentences), **scores}, args.json,
                     f"tagging {args.split}")
    return scores


def build_parser():
    p = command_parser("electra-tag", __doc__)
    sub = p.add_subparsers(dest="command", required=True)
    ft = subcommand(sub, "finetune", "CoNLL files -> a fine-tuned tagger and its dev F1")
    ft.add_argument("--checkpoint", required=True,
                    help="pre-training (or discriminator) checkpoint to fine-tune")
    ft.add_argument("--train", required=True, help="training CoNLL file")
    ft.add_argument("--valid", required=True, help="dev CoNLL file (scored at the end)")
    ft.add_argument("--out-dir", required=True,
                    help="writes data/ (preprocessed), the run (NAME/seed-S) and "
                         "valid.predictions.conll here")
    ft.add_argument("--pretrain-data", help="the tokenizer and dict.txt (default: the "
                                            "checkpoint's pre-training data)")
    ft.add_argument("--name", default="ner", help="the task's name in the outputs")
    ft.add_argument("--seed", type=int, default=1, help="fairseq-train's seed")
    ft.add_argument("--lr", type=float, help="default: the size's official lr")
    ft.add_argument("--layer-decay", type=float, help="default: the size's official value")
    ft.add_argument("--epochs", type=float, help="default: 3 (official)")
    ft.add_argument("--batch-size", type=int, default=32, help="sentences per update")
    ft.add_argument("--max-seq-len", type=int, default=128,
                    help="pieces per sentence with <s> and </s> (official: 128)")
    ft.add_argument("--keep", choices=("final", "best"), default="final",
                    help="score the final model, or the best on dev by entity F1")
    ft.add_argument("--cpu", action="store_true", help="train and predict on the CPU")
    ft.add_argument("--fairseq-options", type=shlex.split, default=[],
                    help="more fairseq-train options, one quoted string; they come last")
    add_json(ft)
    ft.set_defaults(run=finetune)

    pp = subcommand(sub, "preprocess", "CoNLL files -> binarized data for token_tagging")
    pp.add_argument("--pretrain-data", required=True,
                    help="pre-training data directory (dict.txt and the tokenizer)")
    pp.add_argument("--train", help="training CoNLL file (its labels are the model's)")
    pp.add_argument("--valid", help="validation CoNLL file")
    pp.add_argument("--test", help="another CoNLL file to predict")
    pp.add_argument("--out-dir", required=True, help="writes the binarized data here")
    pp.add_argument("--max-seq-len", type=int, default=128,
                    help="pieces per sentence with <s> and </s> (official: 128); words past "
                         "it are predicted as O")
    pp.add_argument("--force", action="store_true", help="write into a non-empty --out-dir")
    renamed(pp, "--destdir", "--out-dir")
    pp.set_defaults(run=preprocess)
    pr = subcommand(sub, "predict", "a checkpoint's labels per word, and the scores")
    pr.add_argument("--checkpoint", required=True, help="a checkpoint of --task token_tagging")
    pr.add_argument("--data", help="preprocessed tagging data (default: the checkpoint's)")
    pr.add_argument("--split", default="valid", help="the split to predict")
    pr.add_argument("--out", help="write the split as CoNLL columns: word, gold, predicted")
    add_json(pr)
    pr.add_argument("--cpu", action="store_true", help="do not use a GPU")
    pr.set_defaults(run=predict)
    return p


main = subcommands(build_parser)
cli = console(main)


if __name__ == "__main__":
    cli()
