#!/usr/bin/env python
"""One probe of the small-compute recipe search: pre-train with some options, fine-tune.

A probe pre-trains ELECTRA-tiny on the demo's news corpus with the demo's recipe plus the
given options, reads the curves of its log (disc AUC, losses, generator accuracy), measures
the feature spread of the checkpoint, and fine-tunes it on a *search* split of the
sentiment training set (1,000 of its sentences held out as search-dev), so that the
sentiment dev set that the demo reports is never used to choose a recipe. One JSON line per
probe is appended to ``--results``.

    # from the repository root (it imports the demo's data steps from scripts/demo.py)
    python -m examples.recipe.probe NAME [--updates 1200] [--seeds 1] -- --temperature 0.5
    python -m examples.recipe.probe random --random-init --seeds 1 2 3
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from electra_plugin.cli.demo import dev_accuracy_cmd, finetune_cmd, log_stats, pretrain_cmd
from scripts.demo import prepare_corpus, prepare_sentiment, run  # the demo's data steps

REPO = Path(__file__).resolve().parents[2]

SEARCH_DEV = 1000  # sentences of the sentiment training set held out for the search


def search_split(workdir: Path, data: str) -> str:
    """sentiment train.tsv -> search train (all but the last SEARCH_DEV) + search dev."""
    out = workdir / "sentiment-search"
    binarized = workdir / "sentiment-search-bin"
    if not (binarized / "label" / "dict.txt").is_file():
        sentiment = Path(prepare_sentiment(str(workdir.parent / "demo"), data)).parent
        lines = (sentiment / "sentiment" / "train.tsv").read_text().splitlines(keepends=True)
        header, rows = lines[0], lines[1:]
        out.mkdir(parents=True, exist_ok=True)
        (out / "train.tsv").write_text(header + "".join(rows[:-SEARCH_DEV]))
        (out / "dev.tsv").write_text(header + "".join(rows[-SEARCH_DEV:]))
        run([sys.executable, "-m", "electra_plugin.cli.glue", "preprocess", "--task", "SST-2",
             "--glue-dir", out, "--pretrain-data", data, "--out-dir", binarized, "--force"])
    return str(binarized)


def finished_updates(checkpoint: str) -> int:
    """Updates a checkpoint holds (0 if none): a finished pre-training is not started again,
    since fairseq, restarted at --max-update, would run one more update."""
    if not os.path.isfile(checkpoint):
        return 0
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    return state["optimizer_history"][-1]["num_updates"]


def curves(log_path: Path):
    """{kind: [{metric: value}]} of the train_inner and valid lines of a --log-file."""
    found = {"train_inner": [], "valid": []}
    for line in log_path.read_text().splitlines():
        kind, stats = log_stats(line)
        if kind is not None:
            found[kind].append(stats)
    return found


def feature_spread(checkpoint: str, data: str, sentences) -> float:
    """The criterion's ``disc_feature_spread`` of the mean-pooled discriminator features."""
    from electra_plugin.criterions.electra import feature_spread
    from electra_plugin.models.hub_interface import from_pretrained

    hub = from_pretrained(os.path.dirname(checkpoint), os.path.basename(checkpoint), data)
    pooled = []
    with torch.no_grad():
        for sentence in sentences:
            pooled.append(hub.extract_features(hub.encode(sentence))[0].mean(0))
    pooled = torch.stack(pooled).double()
    return feature_spread(pooled.sum(0), pooled.square().sum(0), len(pooled))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("name")
    p.add_argument("--updates", type=int, default=1200)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--finetune-updates", type=int, default=900)
    p.add_argument("--finetune-options", default="", help="extra fine-tuning options")
    p.add_argument("--random-init", action="store_true", help="fine-tune without pre-training")
    p.add_argument("--workdir", type=Path, default=REPO / "work_dirs" / "recipe")
    p.add_argument("--results", type=Path, default=REPO / "examples" / "recipe" / "probes.jsonl")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:split])
    args.options = argv[split + 1:]  # pre-training options, after --
    started = time.time()
    demo = args.workdir.parent / "demo"
    for directory in (args.workdir, demo):
        directory.mkdir(parents=True, exist_ok=True)
    data = prepare_corpus(str(demo))
    search = search_split(args.workdir, data)
    probe = args.workdir / args.name
    probe.mkdir(exist_ok=True)
    record = dict(name=args.name, options=args.options, updates=args.updates,
                  finetune_options=args.finetune_options,
                  finetune_updates=args.finetune_updates, random_init=args.random_init)
    checkpoint = None
    if not args.random_init:
        checkpoint = str(probe / "pretrain" / "checkpoint_last.pt")
        log_path = probe / "pretrain.log"
        if finished_updates(checkpoint) < args.updates:  # fairseq resumes an interrupted run
            run(pretrain_cmd(data, probe / "pretrain", args.updates, 1, log_path) + args.options)
        found = curves(log_path)
        keys = ("num_updates", "loss", "gen_loss", "disc_loss", "gen_acc", "sampled_acc",
                "disc_acc", "disc_baseline", "disc_auc", "mlm_acc", "mlm_loss", "train_flops")
        record["train"] = [{k: r[k] for k in keys if k in r} for r in found["train_inner"]]
        record["valid"] = [{k: r[k] for k in keys if k in r} for r in found["valid"]]
        dev = (args.workdir / "sentiment-search" / "dev.tsv").read_text().splitlines()[1:201]
        record["feature_spread"] = feature_spread(checkpoint, data,
                                                  [line.split("\t")[0] for line in dev])
    accuracies = []
    for seed in args.seeds:
        tag = "".join(c for c in args.finetune_options if c.isalnum() or c in "-.")
        save = probe / f"finetune{tag}-u{args.finetune_updates}-{seed}"
        cmd = finetune_cmd(search, save, args.finetune_updates, seed, checkpoint)
        run(cmd + args.finetune_options.split())
        out = run(dev_accuracy_cmd(search, save))
        accuracies.append(json.loads(out.strip().splitlines()[-1])["accuracy"])
    record.update(seeds=args.seeds, accuracy=accuracies,
                  mean=statistics.mean(accuracies),
                  std=statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
                  minutes=round((time.time() - started) / 60, 1))
    with open(args.results, "a") as f:
        f.write(json.dumps(record) + "\n")
    last = (record.get("valid") or [{}])[-1]
    print(f"{args.name}: search-dev accuracy {record['mean']:.2f} +- {record['std']:.2f} "
          f"{accuracies}; final valid {last}; spread {record.get('feature_spread')}")


if __name__ == "__main__":
    main()
