#!/usr/bin/env python
"""Equal-compute study: pre-training objectives and generator sizes at the same training FLOPs.

Every run pre-trains the same small discriminator on the same real corpus and stops at the
same training FLOPs (counted as the paper counts them, ``electra_plugin.models.core.flops``), saving
checkpoints at 1/points, 2/points ... of the budget; every checkpoint is fine-tuned on the
real sentiment set with several seeds. Results: a table (mean +- std dev accuracy) and two
plots, accuracy against training FLOPs per objective, and accuracy against generator size
(the paper's Figure 3, left), written to ``--results``.

    # from the repository root (it imports the demo's data steps from scripts/demo.py)
    python -m examples.objectives.equal_compute                  # CPU, tiny scale (~1-2 h)
    python -m examples.objectives.equal_compute --objectives electra mlm replace_mlm \\
        --budget-updates 4000 --jobs 1                           # more compute

The data are the demo's (``scripts/demo.py`` steps 1, 2 and 4: news articles with an
8000-piece sentencepiece vocabulary, Rotten Tomatoes sentiment); they are fetched and
prepared here when missing. Finished runs are reused on re-runs.
"""

import argparse
import json
import logging
import math
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from electra_plugin.cli.demo import dev_accuracy_cmd, finetune_cmd
from scripts.demo import prepare_corpus, prepare_sentiment  # the demo's data steps
from scripts.electra_vs_mlm import flops_per_update as paper_flops_per_update
from scripts.electra_vs_mlm import model_config

REPO = Path(__file__).resolve().parents[2]

PLUGIN = str(REPO / "electra_plugin")
LENGTH, BATCH = 128, 32
# ELECTRA-tiny (4 layers, hidden 128) with 16-dim heads, so that a 1/8 generator is one head
SIZES = dict(_name="electra_tiny", num_heads=8)
MODEL = ["--arch", SIZES["_name"], "--num-heads", str(SIZES["num_heads"])]
# BERT's masking for the MLM baseline; the other objectives keep ELECTRA's (85% <mask>, 15%
# unchanged, no random tokens)
BERT_MASKING = ["--leave-unmasked-prob", "0.1", "--random-token-prob", "0.1"]


def model_options(objective, generator_size, electra_options=()):
    options = ["--objective", objective]
    if objective != "mlm":
        options += ["--generator-size", str(generator_size), *electra_options]
    return options + (BERT_MASKING if objective == "mlm" else [])


def flops_per_update(objective, generator_size, data):
    """Paper-counted training FLOPs of one full batch of that setting on ``data``'s
    vocabulary (the masked count as the task draws it: 15% of the tokens after <s>)."""
    model = [f"model.num_heads={SIZES['num_heads']}"]
    if objective != "mlm":
        model.append(f"model.generator_size={generator_size}")
    cfg = model_config(model, SIZES["_name"], objective)
    return paper_flops_per_update(cfg, data, LENGTH, BATCH, 0.15)


def execute(cmd, log_path, threads):
    """Run a command with its output in ``log_path``; one line on failure."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    with open(log_path, "a") as log:
        proc = subprocess.run([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT,
                              env=env)
    if proc.returncode:
        tail = Path(log_path).read_text().splitlines()[-5:]
        raise SystemExit(f"equal_compute: failed ({log_path}):\n" + "\n".join(tail))


def pretrain(run, args, data, threads):
    """Pre-train one setting to the FLOPs budget, keeping ``points`` checkpoints."""
    save_dir = args.workdir / run["name"]
    log_path = args.workdir / f"{run['name']}.log"
    every = run["updates"] // args.points
    if not (log_path.exists() and "done training" in log_path.read_text()):
        execute([sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN,
                 "--task", "electra", "--criterion", "electra", *MODEL, *run["options"],
                 "--cpu", "--tokens-per-sample", str(LENGTH), "--batch-size", str(BATCH),
                 "--optimizer", "electra_adam", "--adam-eps", "1e-6", "--weight-decay", "0.01",
                 "--lr", str(args.lr), "--clip-norm", "1.0", "--lr-scheduler",
                 "polynomial_decay", "--warmup-updates", str(run["updates"] // 10),
                 "--total-num-update", str(every * args.points), "--max-update",
                 str(every * args.points), "--save-dir", save_dir, "--no-epoch-checkpoints",
                 "--save-interval-updates", str(every), "--keep-interval-updates", "-1",
                 "--save-interval", "1000000", "--disable-validation", "--log-format", "json",
                 "--log-interval", "50", "--num-workers", "0", "--data-buffer-size", "0",
                 "--seed", str(args.seed)], log_path, threads)
    # fairseq names them checkpoint_<epoch>_<updates>.pt
    saved = {int(path.stem.split("_")[-1]): path for path in save_dir.glob("checkpoint_*_*.pt")}
    wanted = [k * every for k in range(1, args.points + 1)]
    if any(update not in saved for update in wanted):
        raise SystemExit(f"equal_compute: {save_dir} lacks the checkpoints of updates {wanted}; "
                         f"delete {log_path} to re-run")
    # the epoch summaries ("| train |", keys prefixed train_) hold each epoch's averages and
    # the running FLOPs count; the last one is the end of the run
    logs = [{k[len("train_"):] if k.startswith("train_") else k: v
             for k, v in json.loads(line[line.index("{"):]).items()}
            for line in log_path.read_text().splitlines() if "| train |" in line]
    run["final_train"] = {k: logs[-1][k] for k in (
        "loss", "gen_loss", "disc_loss", "mlm_loss", "gen_acc", "disc_acc", "disc_baseline",
        "mlm_acc") if k in logs[-1]}
    run["logged_flops"] = float(logs[-1]["train_flops"])
    run["wall_s"] = float(logs[-1]["wall"])
    return [(update, saved[update]) for update in wanted]


def finetune(args, sentiment, restore, out_dir, seed, threads):
    if not (out_dir / "checkpoint_last.pt").exists():
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        execute(finetune_cmd(sentiment, out_dir, args.finetune_updates, seed, restore, MODEL)
                + args.finetune_options.split(),
                out_dir.parent / f"{out_dir.name}.log", threads)
    result = subprocess.run([str(c) for c in dev_accuracy_cmd(sentiment, out_dir)],
                            capture_output=True, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if result.returncode:
        raise SystemExit(f"equal_compute: evaluating {out_dir} failed: {result.stderr[-500:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["accuracy"]


def summary(values):
    mean = statistics.mean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--objectives", nargs="+", default=["electra", "mlm"],
                   choices=["electra", "electra_15", "replace_mlm", "all_tokens_mlm", "mlm"])
    p.add_argument("--generator-sizes", nargs="+", type=float,
                   default=[0.125, 0.25, 0.5, 1.0],
                   help="electra runs for the generator-size sweep (0.25 is the objectives' "
                        "generator); none to skip the sweep")
    p.add_argument("--generator-size", type=float, default=0.25,
                   help="generator of the objectives comparison")
    p.add_argument("--budget-updates", type=int, default=1000,
                   help="the FLOPs budget, as updates of electra with --generator-size "
                        f"(batch {BATCH} x {LENGTH})")
    p.add_argument("--points", type=int, default=3, help="checkpoints per run")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3],
                   help="fine-tuning seeds")
    p.add_argument("--finetune-updates", type=int, default=400,
                   help="fine-tuning updates of batch 32 (~1.3 epochs of the sentiment set)")
    p.add_argument("--electra-options", default="",
                   help="extra pre-training options of every run with a generator, e.g. a "
                        "recipe's '--disc-weight 1'")
    p.add_argument("--finetune-options", default="",
                   help="extra fine-tuning options of every run, random init included, "
                        "e.g. '--layer-decay 1.0'")
    p.add_argument("--lr", type=float, default=1e-3, help="pre-training peak lr")
    p.add_argument("--seed", type=int, default=1, help="pre-training seed")
    p.add_argument("--jobs", type=int, default=2, help="runs at once (1 thread each of the "
                                                       "machine's cores / jobs)")
    p.add_argument("--workdir", type=Path, default=REPO / "work_dirs" / "equal_compute")
    p.add_argument("--demo-workdir", type=Path, default=REPO / "work_dirs" / "demo",
                   help="where the corpus and the sentiment set are (or are prepared)")
    p.add_argument("--results", type=Path, default=REPO / "examples" / "objectives" / "results")
    args = p.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // args.jobs)

    data = prepare_corpus(str(args.demo_workdir))
    sentiment = prepare_sentiment(str(args.demo_workdir), data)
    budget = args.budget_updates * flops_per_update("electra", args.generator_size, data)

    settings = [(o, args.generator_size) for o in args.objectives]
    settings += [("electra", g) for g in args.generator_sizes if ("electra", g) not in settings]
    runs = []
    for objective, size in settings:
        per_update = flops_per_update(objective, size, data)
        updates = math.ceil(budget / per_update / args.points) * args.points
        name = objective if objective == "mlm" else f"{objective}_g{size:g}"
        runs.append(dict(name=name, objective=objective, generator_size=size,
                         options=model_options(objective, size,
                                               args.electra_options.split()),
                         updates=updates,
                         flops_per_update=per_update))
        print(f"{name}: {updates} updates of {per_update:.3g} FLOPs = {updates * per_update:.3g}")

    with ThreadPoolExecutor(args.jobs) as pool:
        # pre-training first, then fine-tuning each run's checkpoints as soon as it is done
        pretraining = {pool.submit(pretrain, run, args, data, threads): run for run in runs}
        random_jobs = [pool.submit(finetune, args, sentiment, None,
                                   args.workdir / "finetune" / f"random_s{seed}", seed, threads)
                       for seed in args.seeds]
        jobs = []
        for done in as_completed(pretraining):
            run = pretraining[done]
            run["points"] = []
            final_only = run["objective"] not in args.objectives or \
                run["generator_size"] != args.generator_size
            points = done.result()
            for k, (update, path) in enumerate(points, 1):
                if final_only and k < len(points):
                    continue  # the sweep compares the end of training
                point = dict(update=update, flops=update * run["flops_per_update"])
                run["points"].append(point)
                for seed in args.seeds:
                    out = args.workdir / "finetune" / f"{run['name']}_u{update}_s{seed}"
                    jobs.append((point, seed, pool.submit(finetune, args, sentiment, path, out,
                                                          seed, threads)))
        for point, seed, job in jobs:
            point.setdefault("accuracy", {})[seed] = job.result()
        random_init = [job.result() for job in random_jobs]

    report(args, runs, random_init, budget)


def report(args, runs, random_init, budget):
    (args.results / "results.json").write_text(json.dumps(dict(
        budget_flops=budget, settings=vars(args) | dict(workdir=str(args.workdir),
                                                         demo_workdir=str(args.demo_workdir),
                                                         results=str(args.results)),
        runs=runs, random_init=random_init), indent=1, default=str))
    rm, rs = summary(random_init)
    lines = [f"Budget: {budget:.3g} training FLOPs (paper counting) per run; sentiment dev "
             f"accuracy, mean +- std dev over fine-tuning seeds {args.seeds}.", "",
             "| run | objective | generator | updates | train FLOPs | final pre-training "
             "metrics | accuracy at 1/3, 2/3, 1 of the budget |",
             "|---|---|---|---|---|---|---|"]
    for run in runs:
        accs = ", ".join("{:.2f} +- {:.2f}".format(*summary(list(pt["accuracy"].values())))
                         for pt in run["points"])
        final = ", ".join(f"{k} {v}" for k, v in run["final_train"].items()
                          if k not in ("train_flops", "wall"))
        lines.append(f"| {run['name']} | {run['objective']} | "
                     f"{'-' if run['objective'] == 'mlm' else run['generator_size']} | "
                     f"{run['updates']} | {run['logged_flops']:.3g} | {final} | {accs} |")
    lines.append(f"| random init | - | - | 0 | 0 | - | {rm:.2f} +- {rs:.2f} |")
    (args.results / "RESULTS.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(args, runs, random_init)


def plot(args, runs, random_init):
    try:
        logging.getLogger("matplotlib").setLevel(logging.WARNING)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plots: pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        if run["generator_size"] != args.generator_size and run["objective"] != "mlm":
            continue
        xs = [pt["flops"] for pt in run["points"]]
        stats = [summary(list(pt["accuracy"].values())) for pt in run["points"]]
        ax.errorbar(xs, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o",
                    capsize=3, label=run["objective"])
    ax.axhline(statistics.mean(random_init), color="grey", ls="--", label="random init")
    ax.set_xlabel("pre-training FLOPs (paper counting)")
    ax.set_ylabel("sentiment dev accuracy (%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.results / "accuracy_vs_flops.png", dpi=120)

    sweep = sorted((r for r in runs if r["objective"] == "electra"),
                   key=lambda r: r["generator_size"])
    if len(sweep) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        stats = [summary(list(r["points"][-1]["accuracy"].values())) for r in sweep]
        ax.errorbar([r["generator_size"] for r in sweep], [m for m, _ in stats],
                    yerr=[s for _, s in stats], marker="o", capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("generator size (fraction of the discriminator's hidden size)")
        ax.set_ylabel("sentiment dev accuracy (%)")
        ax.set_title("ELECTRA at equal training FLOPs")
        fig.tight_layout()
        fig.savefig(args.results / "generator_size.png", dpi=120)


if __name__ == "__main__":
    main()
