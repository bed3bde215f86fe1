"""GLUE for the plugin: preprocess the official TSVs, evaluate a fine-tuned checkpoint, and
write the hydra fine-tuning configs.

Subcommands:
  preprocess  official GLUE TSVs -> fairseq binarized input0/ input1/ label/ for
              sentence_prediction. Text is tokenized with the pre-training data directory's
              tokenizer and binarized with its dict.txt, so the fine-tuning dictionary is the
              checkpoint's. Sentence pairs are cut longest first to fit ``--max-seq-len``
              tokens with ``<s> A </s> B </s>``, as the official code does.
  evaluate    a fine-tuned checkpoint's official GLUE metric(s) on binarized dev data
  configs     examples/glue/config/: one hydra config per GLUE task plus
              size/{small,base,large}, from electra_plugin.glue.GLUE_TASKS (tests/test_glue.py
              checks the files are up to date)

The configs follow ELECTRA's recipe (PAPER.md): batch 32, 3 epochs (10 for RTE and STS-B),
10% linear warmup then linear decay, Adam eps 1e-6, weight decay 0.01, layer-wise lr decay;
lr 3e-4 / 1e-4 / 5e-5 and decay 0.8 / 0.8 / 0.9 for Small / Base / Large.

Examples:
  electra-glue preprocess --task RTE --glue-dir glue_data/RTE \\
      --pretrain-data data-bin/news --destdir data-bin/RTE
  electra-glue evaluate --task RTE --checkpoint ck/checkpoint_best.pt \\
      --data data-bin/RTE [--split valid] [--predictions out.tsv] [--cpu]
  electra-glue configs [--out examples/glue/config]
"""

import argparse
import json
import logging
import math
import os
import sys
import tempfile

from electra_plugin.data.binarize import fairseq_preprocess
from electra_plugin.data.dictionary import load_dictionary
from electra_plugin.data.evaluation import inference_device, predict_split
from electra_plugin.data.tokenizer import load_tokenizer
from electra_plugin.errors import ElectraUsageError, command_line
from electra_plugin.output_dir import refuse_existing
from electra_plugin.partial_output import removed_on_failure
from electra_plugin.glue import GLUE_TASKS, GlueTask, get_task, read_split, score
from electra_plugin.models.hub_interface import from_pretrained

MAX_POSITIONS = 512


# ------------------------------------------------------------------------------ preprocess
logger = logging.getLogger(__name__)


def fit_pair(pieces, max_tokens):
    """Drop pieces from the end of the longest sentence until the total fits."""
    pieces = [list(p) for p in pieces]
    cut = False
    while sum(len(p) for p in pieces) > max_tokens:
        longest = max(pieces, key=len)
        longest.pop()
        cut = True
    return pieces, cut


def preprocess(args):
    with removed_on_failure(args.destdir):  # a failed run leaves no output that looks whole
        return _preprocess(args)


def _preprocess(args):
    task = get_task(args.task)
    if not 4 <= args.max_seq_len <= MAX_POSITIONS:
        raise ElectraUsageError(f"--max-seq-len {args.max_seq_len} must be between 4 and "
                                f"{MAX_POSITIONS}, the model's positions")
    load_dictionary(args.pretrain_data)  # its one error for a missing or malformed dict.txt
    srcdict = os.path.join(args.pretrain_data, "dict.txt")
    tokenizer = load_tokenizer(args.pretrain_data)
    refuse_existing(args.destdir, args.force)

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
            logger.info(f"{glue_name}: {len(sentences)} examples, {truncated} cut to "
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
                               option_prefixes(f"input{i}"), args.workers, logger.info)
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
                               args.workers, logger.info)
    tokenizer.save_to(args.destdir)  # the hub interface encodes text with it
    logger.info(f"wrote {args.destdir} ({task.name}, {task.num_classes} "
                f"{'output' if task.labels is None else 'classes'})")


# -------------------------------------------------------------------------------- evaluate
def evaluate(args):
    """Prints the metrics and returns them."""
    glue_task = get_task(args.task)
    hub = from_pretrained(os.path.dirname(os.path.abspath(args.checkpoint)),
                          os.path.basename(args.checkpoint), os.path.abspath(args.data))
    device = inference_device(args.cpu)
    logger.info(f"predicting {args.split} on {device.type}")
    preds, gold = predict_split(hub.model.to(device), hub.task, args.split)
    results = score(glue_task, preds, gold)
    if args.predictions:
        with open(args.predictions, "w") as f:
            for value in preds:
                f.write(f"{value:.6f}\n" if glue_task.labels is None
                        else glue_task.labels[value] + "\n")
    if args.json:
        print(json.dumps({"task": glue_task.name, "split": args.split, "n": len(gold),
                          **results}))
    else:
        shown = ", ".join(f"{name} {value:.2f}" for name, value in results.items())
        print(f"{glue_task.name} {args.split} ({len(gold)} examples): {shown}")
    return results


# --------------------------------------------------------------------------------- configs
BATCH_SIZE = 32
SIZES = {  # arch, lr, layer decay
    "small": ("electra_small", 3e-4, 0.8),
    "base": ("electra_base", 1e-4, 0.8),
    "large": ("electra_large", 5e-5, 0.9),
}


def task_yaml(task: GlueTask) -> str:
    updates = math.ceil(task.train_size / BATCH_SIZE) * task.epochs
    regression = task.labels is None
    metric = task.metrics[0]
    report = {"mcc": "report_mcc", "f1": "report_acc_and_f1",
              "pearson": "report_pearson_and_spearman"}.get(metric)
    lines = [
        f"# ELECTRA fine-tuning recipe for GLUE {task.name} (generated by electra-glue configs;",
        "# edit the generator, not this file). Pick the model size with size=small|base|large.",
        "defaults:",
        "  - _self_",
        "  - size: small",
        "",
        "common:",
        "  user_dir: ???",
        "  log_format: simple",
        "  log_interval: 100",
        "",
        "task:",
        "  _name: sentence_prediction",
        "  data: ???",
        "  init_token: 0  # <s> = [CLS]",
        "  separator_token: null  # input0 already ends with </s> = [SEP]: <s> A </s> B </s>",
        f"  num_classes: {task.num_classes}",
        "  max_positions: 512",
        "  shorten_method: truncate",
        "",
        "criterion:",
        "  _name: sentence_prediction",
        f"  regression_target: {str(regression).lower()}",
    ]
    if report:
        lines.append(f"  {report}: true")
    lines += [
        "",
        "checkpoint:",
        "  restore_file: ???  # the pre-trained (or discriminator-only) checkpoint",
        "  reset_optimizer: true",
        "  reset_dataloader: true",
        "  reset_meters: true",
        f"  best_checkpoint_metric: {metric}",
        "  maximize_best_checkpoint_metric: true",
        "  no_epoch_checkpoints: true",
        "",
        "dataset:",
        f"  batch_size: {BATCH_SIZE}",
        "  required_batch_size_multiple: 1",
        "  num_workers: 1",
        "  data_buffer_size: 0  # fairseq's prefetch thread can abort the exit",
        "",
        "optimizer:",
        "  _name: electra_adam",
        "  adam_betas: (0.9,0.999)",
        "  adam_eps: 1e-06",
        "  weight_decay: 0.01",
        "",
        "lr_scheduler:",
        "  _name: polynomial_decay",
        f"  warmup_updates: {math.ceil(0.1 * updates)}  # 10% of {updates}",
        f"  total_num_update: {updates}",
        "  end_learning_rate: 0.0",
        "  power: 1.0",
        "",
        "optimization:",
        "  clip_norm: 1.0",
        f"  max_update: {updates}  # {task.epochs} epochs of {task.train_size} examples",
        f"  max_epoch: {task.epochs}",
        "",
    ]
    return "\n".join(lines)


def size_yaml(size: str) -> str:
    arch, lr, decay = SIZES[size]
    return "\n".join([
        "# @package _global_",
        f"# ELECTRA-{size.capitalize()} fine-tuning: lr {lr:g}, layer-wise lr decay {decay}.",
        "model:",
        f"  _name: {arch}",
        "  dropout: 0.1",
        "  attention_dropout: 0.1",
        "optimizer:",
        f"  layer_decay: {decay}",
        "optimization:",
        f"  lr: [{lr:g}]",
        "",
    ])


def config_files():
    """{relative path: text} of every generated file."""
    files = {f"{t.name.lower().replace('-', '')}.yaml": task_yaml(t) for t in GLUE_TASKS.values()}
    files.update({f"size/{s}.yaml": size_yaml(s) for s in SIZES})
    return files


def configs(args):
    for rel, text in config_files().items():
        path = os.path.join(args.out, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        print(path)


# ------------------------------------------------------------------------------------ main
def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="electra-glue", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True)

    pp = sub.add_parser("preprocess", help="GLUE TSVs -> binarized data for sentence_prediction")
    pp.add_argument("--task", required=True, help="GLUE task name, e.g. RTE, MNLI, STS-B")
    pp.add_argument("--glue-dir", required=True,
                    help="the task's directory in the official layout (train.tsv, dev.tsv ...)")
    pp.add_argument("--pretrain-data", required=True,
                    help="pre-training data directory (dict.txt + tokenizer from electra-prepare)")
    pp.add_argument("--destdir", required=True)
    pp.add_argument("--max-seq-len", type=int, default=128,
                    help="tokens per example with <s> and </s> (official GLUE: 128)")
    pp.add_argument("--workers", type=int, default=1)
    pp.add_argument("--force", action="store_true", help="write into a non-empty --destdir")
    pp.set_defaults(run=preprocess)

    ev = sub.add_parser("evaluate", help="a fine-tuned checkpoint's GLUE metric(s)")
    ev.add_argument("--task", required=True, help="GLUE task name (picks the metric)")
    ev.add_argument("--checkpoint", required=True, help="fine-tuned checkpoint")
    ev.add_argument("--data", required=True, help="output of electra-glue preprocess")
    ev.add_argument("--split", default="valid", help="valid, valid1 (MNLI mismatched) ...")
    ev.add_argument("--predictions", help="write one prediction per line here")
    ev.add_argument("--json", action="store_true", help="print the metrics as JSON")
    ev.add_argument("--cpu", action="store_true",
                    help="run on the CPU (default: the GPU when there is one)")
    ev.set_defaults(run=evaluate)

    cf = sub.add_parser("configs", help="write the hydra fine-tuning configs")
    cf.add_argument("--out", default=os.path.join("examples", "glue", "config"),
                    help="directory to write (default: examples/glue/config, relative to the "
                         "working directory: run it from the repository root)")
    cf.set_defaults(run=configs)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    args.run(args)


def cli():
    """The console script: :func:`main` with its usage errors as one line."""
    sys.exit(command_line(main))


if __name__ == "__main__":
    cli()
