#!/usr/bin/env python
"""Prints a fine-tuned checkpoint's official GLUE metric(s) on binarized dev data.

    python scripts/glue_evaluate.py --task RTE --checkpoint ck/checkpoint_best.pt \
        --data data-bin/RTE [--split valid] [--predictions out.tsv]
"""

import argparse
import json
import os
import sys

import torch

from electra_plugin.models.hub_interface import from_pretrained
from electra_plugin.glue import get_task, score
from electra_plugin.errors import command_line


def predict_split(model, task, split, batch_size=64):
    """-> (predictions, gold labels): class indices, or floats for regression."""
    task.load_dataset(split)
    itr = task.get_batch_iterator(task.dataset(split), max_sentences=batch_size,
                                  max_positions=model.max_positions(),
                                  ignore_invalid_inputs=False).next_epoch_itr(shuffle=False)
    head = task.cfg.classification_head_name
    ids, preds, gold = [], [], []
    with torch.no_grad():
        for sample in itr:
            logits, _ = model(**sample["net_input"], features_only=True,
                              classification_head_name=head)
            # targets come as B x 1 (labels) or B x 1 (one regression value)
            gold += sample["target"].view(-1).tolist()
            if task.cfg.regression_target:
                preds += logits.view(-1).tolist()
            else:
                preds += logits.argmax(-1).tolist()
            ids += sample["id"].tolist()
    order = sorted(range(len(ids)), key=ids.__getitem__)  # back to file order
    return [preds[i] for i in order], [gold[i] for i in order]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", required=True, help="GLUE task name (picks the metric)")
    p.add_argument("--checkpoint", required=True, help="fine-tuned checkpoint")
    p.add_argument("--data", required=True, help="output of scripts/glue_preprocess.py")
    p.add_argument("--split", default="valid", help="valid, valid1 (MNLI mismatched) ...")
    p.add_argument("--predictions", help="write one prediction per line here")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    args = p.parse_args(argv)

    glue_task = get_task(args.task)
    hub = from_pretrained(os.path.dirname(os.path.abspath(args.checkpoint)),
                          os.path.basename(args.checkpoint), os.path.abspath(args.data))
    preds, gold = predict_split(hub.model, hub.task, args.split)
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


if __name__ == "__main__":
    sys.exit(0 if command_line(main) is not None else 1)
