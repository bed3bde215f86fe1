"""Multiple choice for the plugin through fairseq's sentence_ranking task: preprocess, evaluate.

Subcommands:
  preprocess  SWAG CSV, RACE JSON or a generic JSONL ({"context", "choices", "label"}) ->
              binarized input0/ (contexts), input1..N/ (options), label/ for
              ``--task sentence_ranking``; text is tokenized with the pre-training data
              directory's tokenizer and binarized with its dict.txt. Each example is cut to
              fit ``<s> option </s> </s> context </s>`` in ``--max-seq-len`` tokens, the
              longer of the longest option and the context first.
  evaluate    a fine-tuned checkpoint's accuracy on a labelled split, and its chosen option
              per example for any split (the model run once per option, the best score
              chosen, as fairseq's sentence_ranking criterion does)

Example:
  electra-choice preprocess --pretrain-data data-bin/news --train swag/train.csv \\
      --valid swag/val.csv --out-dir data-bin/swag
  fairseq-train data-bin/swag --user-dir electra_plugin --task sentence_ranking \\
      --criterion sentence_ranking --num-classes 4 --init-token 0 --separator-token 2 \\
      --max-positions 512 --arch electra_small --finetune-from-model ck.pt ...
  electra-choice evaluate --checkpoint checkpoints/checkpoint_best.pt \\
      --data data-bin/swag --split valid [--out valid.txt] [--json] [--cpu]
"""

import logging
import os

from electra_plugin.cli.command import console, subcommands
from electra_plugin.cli.vocabulary import (add_json, command_parser, print_result,
                                           renamed, subcommand)
from electra_plugin.data import multiple_choice as mc
from electra_plugin.data.binarize import MAX_SEQ_LEN, writable_destdir
from electra_plugin.data.dictionary import load_dictionary
from electra_plugin.data.tokenizer import load_tokenizer
from electra_plugin.finetuning.kinds import record_task
from electra_plugin.user_io.errors import ElectraUsageError
from electra_plugin.user_io.output_dir import refuse_existing
from electra_plugin.user_io.partial_output import removed_on_failure, written_whole

logger = logging.getLogger(__name__)
DEFAULT_HEAD = "sentence_classification_head"  # sentence_ranking's --ranking-head-name


def preprocess(args):
    inputs = {name: path for name, path in (("train", args.train), ("valid", args.valid),
                                            ("test", args.test)) if path}
    if not inputs:
        raise ElectraUsageError("give at least one of --train, --valid, --test")
    if not mc.SPECIALS + 2 <= args.max_seq_len <= MAX_SEQ_LEN:
        raise ElectraUsageError(f"--max-seq-len {args.max_seq_len} must be between "
                                f"{mc.SPECIALS + 2} and {MAX_SEQ_LEN} (and at most the model's "
                                f"--max-positions)")
    dictionary = load_dictionary(args.pretrain_data)
    tokenizer = load_tokenizer(args.pretrain_data)
    data = {name: mc.read_examples(path, args.format) for name, path in inputs.items()}
    first = next(iter(inputs))
    choices = len(data[first][0].options)
    for name, examples in data.items():
        if len(examples[0].options) != choices:
            raise ElectraUsageError(
                f"{inputs[name]} has {len(examples[0].options)} choices per example, "
                f"{inputs[first]} {choices}; the model ranks one number of options")
    with removed_on_failure(args.out_dir):  # the directory too, when this run made it
        writable_destdir(args.out_dir)
        refuse_existing(args.out_dir, args.force)
        cut = mc.write_data_dir(args.out_dir, data, tokenizer, dictionary,
                                os.path.join(args.pretrain_data, "dict.txt"), args.max_seq_len)
        tokenizer.save_to(args.out_dir)  # the hub interface encodes text with it
        record_task("choice", args.out_dir)
    for name, examples in data.items():
        logger.info(f"{name}: {len(examples)} examples"
                    f"{'' if examples[0].label is not None else ' (unlabelled)'}, "
                    f"{cut[name]} cut to {args.max_seq_len} tokens")
    logger.info(f"wrote {args.out_dir}: train with --task sentence_ranking --criterion "
                f"sentence_ranking --num-classes {choices} --init-token 0 "
                f"--separator-token 2 --max-positions {args.max_seq_len}")


def evaluate(args):
    """Prints the split's accuracy (labelled) as JSON and returns it (None: unlabelled)."""
    from electra_plugin.data.evaluation import inference_device
    from electra_plugin.finetuning.evaluate import load_checked, require_finetuned

    require_finetuned(args.checkpoint, "sentence_ranking")  # named before the data is blamed
    if args.data and not os.path.isfile(os.path.join(args.data, "input0", "dict.txt")):
        raise ElectraUsageError(f"{args.data} has no input0/dict.txt; pass a directory "
                                f"that electra-choice preprocess wrote")
    model, task = load_checked(args.checkpoint, args.data)
    if task.args.num_classes is None:  # an imported ElectraForMultipleChoice: the data's
        task.args.num_classes = mc.choices_in(task.args.data)
    if not mc.check_split(task.args.data, args.split, task.args.num_classes) and \
            not args.out:
        raise ElectraUsageError(f"the {args.split} split of {task.args.data} has no labels to "
                                f"score; pass --out to write its chosen options")
    head = args.head or getattr(task.args, "ranking_head_name", DEFAULT_HEAD)
    device = inference_device(args.cpu)
    scores, gold = mc.option_scores(model.to(device), task, args.split, head, device,
                                    args.batch_size)
    chosen = scores.argmax(dim=1).tolist()
    if args.out:
        with written_whole(args.out) as partial, open(partial, "w") as f:
            f.writelines(f"{c}\n" for c in chosen)
        logger.info(f"wrote {args.out}")
    result = {"split": args.split, "examples": len(chosen)}
    if gold is not None:
        result["accuracy"] = 100.0 * sum(c == g for c, g in zip(chosen, gold)) / len(gold)
    print_result(result, args.json, f"multiple choice {args.split}")
    return result.get("accuracy")


def build_parser():
    p = command_parser("electra-choice", __doc__)
    sub = p.add_subparsers(dest="command", required=True)
    pp = subcommand(sub, "preprocess", "multiple choice files -> data for sentence_ranking")
    pp.add_argument("--pretrain-data", required=True,
                    help="pre-training data directory (dict.txt and the tokenizer)")
    pp.add_argument("--train", help="training file (RACE: also a directory of articles)")
    pp.add_argument("--valid", help="validation file")
    pp.add_argument("--test", help="test file (labels optional)")
    pp.add_argument("--format", choices=mc.FORMATS,
                    help="default: from the suffix (.csv swag, .jsonl jsonl, .json/.txt race)")
    pp.add_argument("--out-dir", required=True, help="writes the binarized data here")
    pp.add_argument("--max-seq-len", type=int, default=512,
                    help="tokens of <s> option </s> </s> context </s>; longer examples are cut")
    pp.add_argument("--force", action="store_true", help="write into a non-empty --out-dir")
    renamed(pp, "--destdir", "--out-dir")
    pp.set_defaults(run=preprocess)
    ev = subcommand(sub, "evaluate", "a checkpoint's accuracy and chosen options")
    ev.add_argument("--checkpoint", required=True, help="a checkpoint of --task sentence_ranking")
    ev.add_argument("--data", help="electra-choice preprocess output (default: the checkpoint's)")
    ev.add_argument("--split", default="valid", help="the split to evaluate")
    ev.add_argument("--head", help="the ranking head (default: the checkpoint's "
                                   f"--ranking-head-name, else {DEFAULT_HEAD})")
    ev.add_argument("--out", help="write the chosen option (0..N-1) per example here")
    ev.add_argument("--batch-size", type=int, default=32, help="examples per batch")
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
