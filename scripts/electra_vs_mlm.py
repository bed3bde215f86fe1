#!/usr/bin/env python
"""The paper's comparison: ELECTRA against masked-LM pre-training at equal training FLOPs,
each fine-tuned by trials next to a random initialisation.

Arms, on the same body, size, vocabulary and data:
  electra      the official recipe of --preset (ELECTRA-Small: generator 1/4, lambda 50,
               lr 5e-4, batch 128 x 128, segment pairs)
  mlm          the same network trained as a masked LM (BERT-Small: the generator's objective
               on the discriminator's network, BERT's 80/10/10 masking), stopped at the
               training FLOPs the electra arm reached (the paper's count)
  random init  the same network, not pre-trained
Warm-up (--warmup, a fraction) and the linear decay are scaled to each arm's run. Each arm is
then fine-tuned on every --task with the same seeds (paired), the final model of each run
evaluated (none picked on dev); the table gives FLOPs, tokens, updates and the fraction of
the paper's 6.25% point (8.9e16 FLOPs) per arm, medians first, paired differences with 95%
intervals, and the time split. Every part writes its results into --out as it finishes
(plan.json, pretrain-ARM.json, finetune-ARM.json, comparison.md), so a cut run still reports.

    # the paper's 6.25% point on one GPU (bf16 autocast, --graphed-step)
    python scripts/electra_vs_mlm.py --data gpu_data/data-bin \\
        --task sentiment=gpu_data/sentiment-bin --task amazon=gpu_data/amazon-bin \\
        --flops 8.9e16 --out results/electra_vs_mlm
    # what fits a lent session: 4000 electra updates, each arm's pre-training under 2.5 min
    python scripts/electra_vs_mlm.py ... --updates 4000 --pretrain-minutes 2.5
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

from electra_plugin.data.binarize import pretraining_data_problem
from electra_plugin.finetuning import report, trials
from electra_plugin.finetuning.statistics import compare_paired, format_summary
from electra_plugin.user_io.errors import ElectraUsageError, command_line
from electra_plugin.user_io.partial_output import written_whole

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "examples", "pretraining", "config")
PAPER_POINT = 8.9e16  # ELECTRA-Small at 6.25% of its training (the paper's Table 1)
ARMS = ("electra", "mlm", "random init")
# BERT's masking for the masked LM: 10% of the picked positions unchanged, 10% random
MLM_OVERRIDES = ["model.objective=mlm", "task.leave_unmasked_prob=0.1",
                 "task.random_token_prob=0.1"]


def write_json(path, value):
    with written_whole(path) as partial, open(partial, "w") as f:
        json.dump(value, f, indent=1)


def model_config(model_overrides, arch, objective):
    """The model config the preset composes for ``arch`` and ``objective`` (what the FLOPs
    count reads: sizes, objective, generator), before any run."""
    import yaml
    from omegaconf import OmegaConf

    from electra_plugin.models.core.config import complete_config

    values = dict(_name=arch, segment_token_types=True)
    for override in model_overrides:
        key, value = override[len("model."):].split("=", 1)
        values[key] = yaml.safe_load(value)  # as hydra reads a value: 8 a number
    values["objective"] = objective
    if objective == "mlm":
        values.pop("generator_size", None)
    return complete_config(OmegaConf.create(values))


def flops_per_update(cfg, data, length, batch, mask_prob):
    """Paper-counted training FLOPs of one full batch of the model ``cfg`` on ``data``'s
    vocabulary, with the nominal masked count (mask_prob of the tokens after <s>)."""
    from electra_plugin.data.dictionary import MASK_SYMBOL, load_dictionary
    from electra_plugin.models.electra import ElectraModel

    dictionary = load_dictionary(data)
    dictionary.add_symbol(MASK_SYMBOL)
    predicted = round(mask_prob * (length - 1)) * batch
    return ElectraModel(cfg, dictionary, pretraining=True).train_flops(length, batch, predicted)


def checkpoint_counts(path):
    """(updates, training FLOPs) a pre-training checkpoint records."""
    from electra_plugin.models.core.checkpoint import load_checkpoint

    state = load_checkpoint(path)
    return (int(state["optimizer_history"][-1]["num_updates"]),
            float(state["model"]["flops_counter.flops"]))


def log_pace(log_path):
    """(updates, wall s) of the first and last train_inner lines of a fairseq log."""
    from electra_plugin.cli.demo import log_stats

    points = []
    for line in open(log_path, errors="replace"):
        kind, stats = log_stats(line)
        if kind == "train_inner" and "num_updates" in stats and "wall" in stats:
            points.append((stats["num_updates"], stats["wall"]))
    return points


def pretrain(args, arm, overrides, planned, updates, run):
    """fairseq-hydra-train of one arm: ``planned`` updates of schedule, stopped at ``updates``
    or by --pretrain-minutes; -> its record (also written to --out)."""
    save_dir = os.path.join(args.workdir, f"pretrain-{arm}")
    log_path = os.path.join(args.workdir, f"pretrain-{arm}.log")
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    cmd = [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", CONFIGS,
           "--config-name", args.preset, f"task.data={args.data}",
           f"common.user_dir={trials.PLUGIN}", f"model._name={args.arch}",
           f"common.seed={args.seed}", f"common.log_file={log_path}",
           f"common.log_interval={args.log_interval}", f"common.cpu={str(args.cpu).lower()}",
           f"task.tokens_per_sample={args.length}", f"dataset.batch_size={args.batch}",
           f"task.global_batch_size={args.batch}", f"optimization.max_update={updates}", f"++lr_scheduler.total_num_update={planned}",
           f"lr_scheduler.warmup_updates={max(1, round(args.warmup * planned))}",
           f"checkpoint.save_dir={save_dir}", "checkpoint.save_interval=1000000",
           "checkpoint.save_interval_updates=0", "checkpoint.no_save_optimizer_state=true",
           "dataset.disable_validation=true", f"hydra.run.dir={save_dir}-hydra"]
    if args.pretrain_minutes:
        cmd.append(f"optimization.stop_time_hours={args.pretrain_minutes / 60}")
    if not args.cpu:  # the GPU's pace: bf16 autocast on fp32 weights
        cmd.append("task.autocast_bf16=true")
    cmd.append(f"task.graphed_step={str(args.graphed).lower()}")
    cmd += overrides + args.override
    record_path = os.path.join(args.out, f"pretrain-{arm}.json")
    if os.path.isfile(checkpoint):  # a finished run of these settings is reused
        saved = json.load(open(record_path)) if os.path.isfile(record_path) else {}
        if saved.get("command") != cmd:
            raise ElectraUsageError(f"{save_dir} holds a pre-training of other settings (or "
                                    f"of another --out); remove it or give another --workdir")
        print(f"(done: the {arm} arm, {checkpoint})", flush=True)
        return saved
    started = time.time()
    if os.path.isfile(log_path):
        os.remove(log_path)  # an unfinished run's log (fairseq appends)
    run(cmd)
    done, flops = checkpoint_counts(checkpoint)
    pace = log_pace(log_path)
    record = dict(arm=arm, planned_updates=planned, updates=done, flops=flops,
                  tokens=done * args.batch * args.length,
                  fraction_of_paper_point=flops / PAPER_POINT, checkpoint=checkpoint,
                  wall_s=round(time.time() - started, 1), command=cmd)
    (u0, w0), (u1, w1) = (pace[0], pace[-1]) if pace else ((0, 0), (0, 0))
    if u1 > u0 and w1 > w0:  # the steady pace between the first and last log lines (whole
        # seconds); the rest of the process's time is start-up, compiling and saving
        per_update = (w1 - w0) / (u1 - u0)
        record.update(tokens_per_s=round(args.batch * args.length / per_update),
                      startup_and_compile_s=round(record["wall_s"] - per_update * done, 1))
    write_json(record_path, record)
    return record


def finetune(args, arm, start, tasks):
    """The trials of one arm on every task; -> their results and wall time (also written to
    --out)."""
    started = time.time()
    planned = [t for task in tasks
               for t in trials.plan([task], start, args.seeds, args.workdir,
                                    "finetune-" + arm.replace(" ", "-"))]
    recipe = trials.Recipe(max_update=args.finetune_updates, epochs=args.finetune_epochs,
                           cpu=args.cpu)
    record = dict(arm=arm, results=trials.run_trials(planned, recipe, jobs=args.jobs))
    record["wall_s"] = round(time.time() - started, 1)
    write_json(os.path.join(args.out, f"finetune-{arm.replace(' ', '-')}.json"), record)
    return record


def comparison(args, pretrained, finetuned, wall):
    """The comparison table from whatever has finished, as markdown."""
    lines = ["| arm | updates | tokens | train FLOPs | of the 6.25% point | pre-training s | "
             "of which start-up + compile | tokens/s after it | fine-tuning s |",
             "|---|" + "---:|" * 8]
    for arm in ARMS:
        p, f = pretrained.get(arm), finetuned.get(arm)
        cells = ["0"] * 4 + ["", "", ""] if arm == "random init" else (
            ["not run"] * 7 if p is None else
            [f"{p['updates']:,}", f"{p['tokens']:.3g}", f"{p['flops']:.3g}",
             f"{p['fraction_of_paper_point']:.2%}", f"{p['wall_s']:.0f}",
             f"{p.get('startup_and_compile_s', '')}",
             f"{p['tokens_per_s']:,}" if "tokens_per_s" in p else ""])
        cells.append("not run" if f is None else f"{f['wall_s']:.0f}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    results = [r for arm in ARMS for r in (finetuned.get(arm) or {}).get("results", [])]
    if results:
        rows = [r for r in report.report_rows(results) if r.judges]
        lines += ["", "| task | arm | " + " | ".join(("median", "mean +- std", "min", "max",
                                                       "failed")) + " |", "|---|---|" +
                  "---:|" * 5]
        for row in rows:
            s = row.summary
            lines.append(f"| {row.name} | {row.arm} | {s.median:.2f} | {s.mean:.2f} +- "
                         f"{s.std:.2f} | {s.min:.2f} | {s.max:.2f} | {s.failed} of {s.n} |")
        lines += ["", "| task | paired by seed | mean difference | 95% interval | Wilcoxon p |",
                  "|---|---|---:|---|---:|"]
        by = {(r.name, r.arm): r for r in rows}
        for name in dict.fromkeys(r.name for r in rows):
            for a, b in (("electra", "mlm"), ("electra", "random init"), ("mlm", "random init")):
                if (name, a) in by and (name, b) in by and by[name, a].seeds == by[name, b].seeds:
                    c = compare_paired(by[name, a].scores, by[name, b].scores, (a, b))
                    p = "n/a" if c.wilcoxon_p is None else f"{c.wilcoxon_p:.3f}"
                    lines.append(f"| {name} | {a} - {b} | {c.mean_difference:+.2f} | "
                                 f"{c.low:+.2f}..{c.high:+.2f} | {p} |")
    lines += ["", f"wall time so far: {wall:.0f} s; seeds {args.seeds}; final model of each "
              f"fine-tuning run (none picked on dev)"]
    return "\n".join(lines) + "\n"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="the binarized corpus (electra-prepare)")
    p.add_argument("--task", action="append", required=True, metavar="NAME=DIR",
                   help="a fine-tuning task and its prepared data (electra-glue preprocess); "
                        "repeat for more")
    p.add_argument("--out", required=True, help="where the results are written as they come")
    p.add_argument("--workdir", help="checkpoints and fine-tuning runs (default: OUT/work)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--flops", type=float, default=PAPER_POINT,
                        help="training FLOPs of each pre-trained arm (paper counting; default "
                             "8.9e16, the paper's 6.25%% point)")
    budget.add_argument("--updates", type=int, help="the electra arm's updates instead of "
                                                    "--flops (the mlm arm matches its FLOPs)")
    p.add_argument("--pretrain-minutes", type=float,
                   help="stop each arm's pre-training after this long (compile included); the "
                        "mlm arm still aims at the FLOPs the electra arm reached")
    p.add_argument("--preset", default="electra_small",
                   help="pre-training config of examples/pretraining/config")
    p.add_argument("--arch", default="electra_small")
    p.add_argument("--batch", type=int, default=128, help="sequences per update")
    p.add_argument("--length", type=int, default=128, help="tokens per sequence")
    p.add_argument("--warmup", type=float, default=0.1, help="warm-up, a fraction of the run")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a hydra override of both arms' pre-training (repeat)")
    p.add_argument("--seed", type=int, default=1, help="pre-training seed")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5],
                   help="fine-tuning seeds, paired across the arms")
    p.add_argument("--jobs", type=int, help="fine-tuning runs at once (default: an arm's runs "
                                            "on a GPU, 1 on the CPU)")
    finetune_length = p.add_mutually_exclusive_group()
    finetune_length.add_argument("--finetune-epochs", type=float,
                                 help="default: each task's official count (3 for most)")
    finetune_length.add_argument("--finetune-updates", type=int)
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--cpu", action="store_true", help="run on the CPU (fp32)")
    p.add_argument("--graphed", action=argparse.BooleanOptionalAction,
                   help="pre-train with --graphed-step (default: on a GPU, not on the CPU)")
    args = p.parse_args(argv)
    for name in ("updates", "jobs", "finetune_updates", "batch", "length", "log_interval"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} {value} must be at least 1")
    if args.updates is None and not args.flops > 0:
        p.error(f"--flops {args.flops:g} must be more than 0")
    if args.pretrain_minutes is not None and not args.pretrain_minutes > 0:
        p.error(f"--pretrain-minutes {args.pretrain_minutes:g} must be more than 0")
    if not 0 <= args.warmup < 1:
        p.error(f"--warmup {args.warmup:g} is not a fraction in [0, 1)")
    bad = [o for o in args.override if "=" not in o]
    if bad:
        p.error(f"--override {bad[0]!r} is not KEY=VALUE")
    args.data = os.path.abspath(args.data)
    args.out = os.path.abspath(args.out)
    args.workdir = os.path.abspath(args.workdir or os.path.join(args.out, "work"))
    args.graphed = not args.cpu if args.graphed is None else args.graphed
    # a GPU takes every run of an arm at once (each a process of its own)
    args.jobs = args.jobs or (1 if args.cpu else min(len(args.seeds) * len(args.task),
                                                      os.cpu_count() or 1))
    return args


def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    problem = pretraining_data_problem(args.data)
    if problem:
        raise ElectraUsageError(f"--data {args.data} {problem}; make it with electra-prepare")
    trials.check_seeds(args.seeds)
    tasks = [trials.parse_task(spec) for spec in args.task]
    for task in tasks:  # before anything is written
        trials.check_data(task)
    for directory in (args.out, args.workdir):
        os.makedirs(directory, exist_ok=True)
    pretrained, finetuned = {}, {}

    def write_table():
        table = comparison(args, pretrained, finetuned, time.time() - started)
        with written_whole(os.path.join(args.out, "comparison.md")) as partial, \
                open(partial, "w") as f:
            f.write(table)
        return table

    def run(cmd):
        print("$ " + " ".join(cmd), flush=True)
        with open(os.path.join(args.workdir, "commands.log"), "a") as log:
            log.write(" ".join(cmd) + "\n")
        if subprocess.run(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1")).returncode:
            raise ElectraUsageError(f"pre-training failed: {' '.join(cmd[:6])} ... (its log "
                                    f"is above)")

    # the plan: the electra arm's updates from the budget, the mlm arm's from equal FLOPs
    overrides = [o.lstrip("+") for o in args.override]  # hydra's +key and ++key too
    model = [o for o in overrides if o.startswith("model.")]
    mask_prob = 0.15
    for o in overrides:
        if o.startswith("task.mask_prob="):
            mask_prob = float(o.split("=", 1)[1])
    per_update = {arm: flops_per_update(model_config(model, args.arch, objective), args.data,
                                        args.length, args.batch, mask_prob)
                  for arm, objective in (("electra", "electra"), ("mlm", "mlm"))}
    planned = args.updates or math.ceil(args.flops / per_update["electra"])
    ratio = per_update["electra"] / per_update["mlm"]
    write_json(os.path.join(args.out, "plan.json"), dict(
        flops_per_update=per_update, electra_updates=planned,
        mlm_updates=round(planned * ratio), flops=planned * per_update["electra"],
        arguments=vars(args)))
    print(f"plan: electra {planned:,} updates of {per_update['electra']:.3g} FLOPs, mlm "
          f"{round(planned * ratio):,} of {per_update['mlm']:.3g}: "
          f"{planned * per_update['electra']:.3g} FLOPs each", flush=True)

    pretrained["electra"] = pretrain(args, "electra", [], planned, planned, run)
    write_table()
    # the same FLOPs as the electra arm reached (all of the plan unless the clock cut it),
    # on the same share of the mlm arm's own schedule
    reached = round(pretrained["electra"]["updates"] * ratio)
    pretrained["mlm"] = pretrain(args, "mlm", MLM_OVERRIDES, round(planned * ratio), reached,
                                 run)
    write_table()

    electra_start = trials.from_checkpoint(pretrained["electra"]["checkpoint"], "electra")
    starts = {"electra": electra_start,
              "mlm": trials.from_checkpoint(pretrained["mlm"]["checkpoint"], "mlm"),
              "random init": trials.random_init(electra_start.model_args)}
    for arm in ARMS:
        finetuned[arm] = finetune(args, arm, starts[arm], tasks)
        table = write_table()
    print("\n" + table, flush=True)
    rows = [r for r in report.report_rows([r for f in finetuned.values()
                                           for r in f["results"]]) if r.judges]
    for row in rows:
        print(f"  {row.name:<10} {row.arm:<12} {format_summary(row.summary)}")


if __name__ == "__main__":
    command_line(main)
