#!/usr/bin/env python
"""The paper's comparison: ELECTRA against masked-LM pre-training at equal training FLOPs,
each fine-tuned by trials next to a random initialisation.

Arms, on the same body, size, vocabulary and data:
  electra      the official recipe of --preset (ELECTRA-Small: generator 1/4, lambda 50,
               lr 5e-4, batch 128 x 128, segment pairs)
  mlm          the same network trained as a masked LM (BERT-Small: the generator's objective
               on the discriminator's network, BERT's 80/10/10 masking)
  random init  the same network, not pre-trained
Both pre-trained arms are planned to the same training FLOPs (the paper's count: each arm's
updates from its own FLOPs per update) and run at once, two processes on the one device, so
that their compiles and host work overlap. Warm-up (--warmup, a fraction) and the linear
decay are scaled to each arm's planned updates.

The clock. Each arm stops --compile-minutes C plus --pretrain-minutes M after its trainer
starts (fairseq's stop_time_hours): a start-up and compile within C leave it at least M
minutes of pre-training. Time to the first update is measured apart (start-up: to fairseq's
first batch; compile: the first update). An arm whose compile outlasts C + M stops after its
first update; one without an update --deadline-minutes after its start is stopped and
counts zero updates. The table gives what each arm reached, and says so when the clock cut the two
at unequal FLOPs; every arm that saved a checkpoint is fine-tuned.

Each arm is then fine-tuned on every --task with the same seeds (paired), the final model of
each run evaluated (none picked on dev). Every part writes into --out-dir as it finishes:
plan.json, pace.txt (a line per arm at its start, its first updates and every 15 s),
pretrain-ARM.json, finetune-ARM.json and comparison.md, so a cut run still reports.

What 1e16 FLOPs per arm in one lent 15-minute GPU window asks (electra_small at 128 x 128 and
a 30,522-piece vocabulary: 1.29e12 FLOPs per electra update, 9.8e11 per mlm update, so 7,742
and 10,242 updates): gpu_session.sh's first call (540 s) leaves its compare stage about 520
s, keeps 200 s for the fine-tuning and gives C = 1 and M = about 3.9 minutes. Both arms at
once then need about 33 and 44 updates/s (540k and 710k tokens/s, 4.3e13 FLOP/s each) after
a compile of at most 60 s. The plan line states this for any settings; pace.txt and the table
state what the run reached.

    # the paper's 6.25% point on one GPU (bf16 autocast, --graphed-step)
    python scripts/electra_vs_mlm.py --data gpu_data/data-bin \\
        --task sentiment=gpu_data/sentiment-bin --task amazon=gpu_data/amazon-bin \\
        --flops 8.9e16 --out-dir results/electra_vs_mlm
    # what fits a lent session: 1e16 FLOPs per arm, a minute to compile, 4 minutes after it
    python scripts/electra_vs_mlm.py ... --flops 1e16 --compile-minutes 1 --pretrain-minutes 4
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

from electra_plugin.cli.vocabulary import command_parser, renamed
from electra_plugin.data.binarize import pretraining_data_problem
from electra_plugin.finetuning import report, trials
from electra_plugin.finetuning.statistics import compare_paired, format_summary
from electra_plugin.run.stop_signals import stopped_by_signals
from electra_plugin.speed.launch import start_fairseq_train
from electra_plugin.user_io.errors import ElectraUsageError, command_line
from electra_plugin.user_io.partial_output import written_whole

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "examples", "pretraining", "config")
PAPER_POINT = 8.9e16  # ELECTRA-Small at 6.25% of its training (the paper's Table 1)
ARMS = ("electra", "mlm", "random init")
# BERT's masking for the masked LM: 10% of the picked positions unchanged, 10% random
MLM_OVERRIDES = ["model.objective=mlm", "task.leave_unmasked_prob=0.1",
                 "task.random_token_prob=0.1"]
PACE_SECONDS = 15  # a pace line per running arm at least this often


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


def random_init_start(cfg):
    """The random initialisation of the network ``cfg`` builds (its discriminator), where no
    arm saved a checkpoint to read it from (``cfg`` knows --arch and the overrides, not the
    body a preset's YAML may choose)."""
    from electra_plugin.models.bodies import discriminator_options
    from electra_plugin.models.core.config import cli_options

    return trials.random_init(["--arch", cfg["_name"]] + cli_options(
        cfg, (*discriminator_options(cfg), "segment_token_types")))


def checkpoint_counts(path):
    """(updates, training FLOPs) a pre-training checkpoint records."""
    from electra_plugin.models.core.checkpoint import load_checkpoint

    state = load_checkpoint(path)
    return (int(state["optimizer_history"][-1]["num_updates"]),
            float(state["model"]["flops_counter.flops"]))


def line_time(line):
    """Seconds since the epoch of a fairseq console line ('[2026-11-28 18:06:34,608][...'),
    or None."""
    try:
        return datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def pace_figures(arm, per_update, tokens_per_update):
    """From an arm's console so far: start-up s (to fairseq's first batch), compile s (the
    first update), updates, steady tokens/s and FLOP/s (between its first and last train_inner
    lines); None where not yet known."""
    from electra_plugin.cli.demo import log_stats

    first_batch, points = None, []  # points: (time, updates) of each train_inner line
    for line in open(arm["console"], errors="replace"):
        if first_batch is None and "Start iterating over samples" in line:
            first_batch = line_time(line)
        kind, stats = log_stats(line)
        if kind == "train_inner" and "num_updates" in stats and line_time(line):
            points.append((line_time(line), int(stats["num_updates"])))
    figures = dict(startup_s=None, compile_s=None, updates=0, tokens_per_s=None,
                   flops_per_s=None)
    if first_batch is not None:
        figures["startup_s"] = round(first_batch - arm["started"], 1)
    if points:
        (t0, u0), (t1, u1) = points[0], points[-1]
        figures["updates"] = u1
        seconds_per_update = (t1 - t0) / (u1 - u0) if u1 > u0 and t1 > t0 else None
        if seconds_per_update:
            figures.update(tokens_per_s=round(tokens_per_update / seconds_per_update),
                           flops_per_s=per_update / seconds_per_update)
        if first_batch is not None:  # the first update ends u0 - 1 updates before line 1
            figures["compile_s"] = round(t0 - first_batch - (u0 - 1) *
                                         (seconds_per_update or 0), 1)
    return figures


def pace_line(arm, figures, now, clock_end):
    """One line on how an arm is doing, with the FLOPs it would reach when its clock ends."""
    if not figures["updates"]:
        phase = ("starting" if figures["startup_s"] is None else
                 f"start-up {figures['startup_s']:.0f} s, compiling since")
        return f"{arm['name']}: no update yet, {now - arm['started']:.0f} s after its start " \
               f"({phase})"
    done = figures["updates"] * arm["per_update"]
    line = (f"{arm['name']}: update {figures['updates']:,} of {arm['planned']:,}, start-up "
            f"{figures['startup_s']} s + compile {figures['compile_s']} s")
    if figures["tokens_per_s"]:
        projected = arm["planned"] * arm["per_update"] if clock_end is None else min(
            arm["planned"] * arm["per_update"],
            done + figures["flops_per_s"] * max(0.0, clock_end - now))
        line += (f", {figures['tokens_per_s']:,} tokens/s, {figures['flops_per_s']:.3g} "
                 f"FLOP/s, projected {projected:.3g} FLOPs "
                 f"({projected / (arm['planned'] * arm['per_update']):.0%} of the plan)")
    return line


def arm_command(args, arm, overrides, planned):
    """fairseq-hydra-train of one arm: ``planned`` updates, the lr schedule over them, and the
    clock of --compile-minutes + --pretrain-minutes."""
    save_dir = os.path.join(args.work_dir, f"pretrain-{arm}")
    cmd = [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", CONFIGS,
           "--config-name", args.preset, f"task.data={args.data}",
           f"common.user_dir={trials.PLUGIN}", f"model._name={args.arch}",
           f"common.seed={args.seed}", f"common.log_interval={args.log_interval}",
           f"common.cpu={str(args.cpu).lower()}", f"task.tokens_per_sample={args.length}",
           f"dataset.batch_size={args.batch}", f"task.global_batch_size={args.batch}",
           f"optimization.max_update={planned}", f"++lr_scheduler.total_num_update={planned}",
           f"lr_scheduler.warmup_updates={max(1, round(args.warmup * planned))}",
           f"checkpoint.save_dir={save_dir}", "checkpoint.save_interval=1000000",
           "checkpoint.save_interval_updates=0", "checkpoint.no_save_optimizer_state=true",
           "dataset.disable_validation=true", f"hydra.run.dir={save_dir}-hydra"]
    if args.pretrain_minutes:
        hours = (args.compile_minutes + args.pretrain_minutes) / 60
        cmd.append(f"optimization.stop_time_hours={hours}")
    if not args.cpu:  # the GPU's pace: bf16 autocast on fp32 weights
        cmd.append("task.autocast_bf16=true")
    cmd.append(f"task.graphed_step={str(args.graphed).lower()}")
    return cmd + overrides + args.override


def stop(proc):
    """End a process: SIGTERM, then SIGKILL if it is still there 10 s later."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@stopped_by_signals()
def pretrain_together(args, arms, say):
    """Run the arms' processes at once (each console and the commands in --out-dir, beside
    the table: a lent machine returns that folder), a pace line per arm as it starts, as
    its train_inner lines come (at most every PACE_SECONDS after the first) and every
    PACE_SECONDS before them; an arm without an update at --deadline-minutes is stopped.
    -> {arm name: how it ended}"""
    clock = (args.compile_minutes + args.pretrain_minutes) * 60 if args.pretrain_minutes \
        else None
    for arm in arms:
        with open(os.path.join(args.out_dir, "commands.log"), "a") as log:
            log.write(" ".join(arm["cmd"]) + "\n")
        arm["started"] = time.time()
        with open(arm["console"], "w") as console:  # forked warm (speed/launch.py)
            arm["process"] = start_fairseq_train(arm["cmd"], console,
                                                 dict(os.environ, PYTHONUNBUFFERED="1"))
        arm["said"], arm["updates_said"] = arm["started"], 0
        say(f"{arm['name']}: started (console: {arm['console']})")
    ended = {}
    try:
        while len(ended) < len(arms):
            time.sleep(0.5)
            now = time.time()
            for arm in arms:
                if arm["name"] in ended:
                    continue
                code = arm["process"].poll()
                figures = pace_figures(arm, arm["per_update"], args.batch * args.length)
                unsaid = figures["updates"] > arm["updates_said"]
                fresh = unsaid and (not arm["updates_said"] or now - arm["said"] >= PACE_SECONDS)
                # an arm that ended since the last look: its last updates said before its end
                if (fresh or now - arm["said"] >= PACE_SECONDS) if code is None else unsaid:
                    say(pace_line(arm, figures, now, clock and arm["started"] + clock))
                    arm["said"], arm["updates_said"] = now, figures["updates"]
                if code is None and args.deadline_minutes and not figures["updates"] and \
                        now - arm["started"] > args.deadline_minutes * 60:
                    stop(arm["process"])  # (one that updates stops by its clock)
                    ended[arm["name"]] = "stopped at --deadline-minutes, before an update"
                elif code == 0:
                    ended[arm["name"]] = "done"
                elif code is not None:
                    ended[arm["name"]] = f"failed (exit status {code})"
                    tail = open(arm["console"], errors="replace").read().splitlines()[-15:]
                    print("\n".join(tail), flush=True)
                if arm["name"] in ended:
                    arm["wall_s"] = round(now - arm["started"], 1)
                    say(f"{arm['name']}: {ended[arm['name']]} after "
                        f"{now - arm['started']:.0f} s")
    finally:  # an error, an interrupt or SIGTERM stops the arms too
        for arm in arms:
            if arm["process"].poll() is None:
                stop(arm["process"])
    return ended


def arm_record(args, arm, ended, target):
    """What an arm reached (from its checkpoint, zero updates without one) and how."""
    checkpoint = os.path.join(args.work_dir, f"pretrain-{arm['name']}", "checkpoint_last.pt")
    done, flops = checkpoint_counts(checkpoint) if os.path.isfile(checkpoint) else (0, 0.0)
    console = open(arm["console"], errors="replace").read()
    if ended == "done":
        ended = ("stopped by its clock" if "Stopping training due to cumulative_training_time"
                 in console else "its planned updates")
    figures = pace_figures(arm, arm["per_update"], args.batch * args.length)
    return dict(arm=arm["name"], planned_updates=arm["planned"], updates=done, flops=flops,
                tokens=done * args.batch * args.length, fraction_of_target=flops / target,
                fraction_of_paper_point=flops / PAPER_POINT,
                checkpoint=checkpoint if done else None, ended=ended,
                started_at=round(arm["started"], 1), wall_s=arm["wall_s"],
                **{k: figures[k] for k in ("startup_s", "compile_s", "tokens_per_s",
                                           "flops_per_s")},
                console=arm["console"], command=arm["cmd"])


def pretrain(args, plan, say):
    """Both arms' pre-training (a finished arm of the same settings reused); -> their
    records (also written to --out-dir)."""
    arms, records = [], {}
    for name, overrides in (("electra", []), ("mlm", MLM_OVERRIDES)):
        arm = dict(name=name, planned=plan["updates"][name],
                   per_update=plan["flops_per_update"][name],
                   console=os.path.join(args.out_dir, f"pretrain-{name}.out"),
                   cmd=arm_command(args, name, overrides, plan["updates"][name]))
        record_path = os.path.join(args.out_dir, f"pretrain-{name}.json")
        saved = json.load(open(record_path)) if os.path.isfile(record_path) else {}
        save_dir = os.path.join(args.work_dir, f"pretrain-{name}")
        if os.path.isfile(os.path.join(save_dir, "checkpoint_last.pt")):
            if saved.get("command") != arm["cmd"]:
                raise ElectraUsageError(f"{save_dir} holds a pre-training of other settings "
                                        f"(or of another --out-dir); remove it or give another "
                                        f"--work-dir")
            say(f"{name}: done before ({saved['checkpoint']})")
            records[name] = saved
        else:
            arms.append(arm)
    ended = pretrain_together(args, arms, say) if arms else {}
    for arm in arms:
        records[arm["name"]] = arm_record(args, arm, ended[arm["name"]], plan["flops"])
        write_json(os.path.join(args.out_dir, f"pretrain-{arm['name']}.json"),
                   records[arm["name"]])
    return records


def finetune(args, arm, start, tasks):
    """The trials of one arm on every task; -> their results and wall time (also written to
    --out-dir)."""
    started = time.time()
    planned = [t for task in tasks
               for t in trials.plan([task], start, args.seeds, args.work_dir,
                                    "finetune-" + arm.replace(" ", "-"))]
    recipe = trials.Recipe(max_update=args.finetune_updates, epochs=args.finetune_epochs,
                           cpu=args.cpu)
    record = dict(arm=arm, results=trials.run_trials(planned, recipe, jobs=args.jobs))
    record["wall_s"] = round(time.time() - started, 1)
    write_json(os.path.join(args.out_dir, f"finetune-{arm.replace(' ', '-')}.json"), record)
    return record


def pretraining_rows(pretrained, finetuned):
    """The first table: what each arm reached, its time split and its fine-tuning's time."""
    lines = ["| arm | updates (planned) | tokens | train FLOPs | of the plan | of the 6.25% "
             "point | start-up s | compile s | process s | tokens/s after the compile "
             "| ended | fine-tuning s |", "|---|" + "---:|" * 9 + "---|---:|"]
    for arm in ARMS:
        p, f = pretrained.get(arm), finetuned.get(arm)
        if arm == "random init":
            cells = ["0", "0", "0", "", "0", "", "", "", "", ""]
        elif p is None:
            cells = ["not run"] * 10
        else:
            cells = [f"{p['updates']:,} ({p['planned_updates']:,})", f"{p['tokens']:.3g}",
                     f"{p['flops']:.3g}", f"{p['fraction_of_target']:.0%}",
                     f"{p['fraction_of_paper_point']:.2%}"] + \
                    ["" if p[k] is None else f"{p[k]:.0f}" for k in ("startup_s", "compile_s")] + \
                    [f"{p['wall_s']:.0f}", "" if p["tokens_per_s"] is None else
                     f"{p['tokens_per_s']:,}", p["ended"]]
        cells.append("not run" if f is None else f"{f['wall_s']:.0f}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    flops = {arm: pretrained[arm]["flops"] for arm in ("electra", "mlm") if arm in pretrained}
    if len(flops) == 2 and max(flops.values()) > 0 and \
            abs(flops["electra"] - flops["mlm"]) > 0.01 * max(flops.values()):
        lines += ["", f"Unequal FLOPs: the arms reached electra {flops['electra']:.3g} and mlm "
                  f"{flops['mlm']:.3g} training FLOPs; each paired difference names the FLOPs "
                  f"of its two arms."]
    return lines


def comparison(args, pretrained, finetuned, wall):
    """The comparison table from whatever has finished, as markdown."""
    lines = pretraining_rows(pretrained, finetuned)
    flops = {arm: f"{p['flops']:.3g}" for arm, p in pretrained.items()}
    flops["random init"] = "0"
    results = [r for arm in ARMS for r in (finetuned.get(arm) or {}).get("results", [])]
    if results:
        rows = [r for r in report.report_rows(results) if r.judges]
        columns = ("median", "mean +- std", "min", "max", "failed")
        lines += ["", "| task | arm | " + " | ".join(columns) + " |",
                  "|---|---|" + "---:|" * len(columns)]
        for row in rows:
            s = row.summary
            lines.append(f"| {row.name} | {row.arm} | {s.median:.2f} | {s.mean:.2f} +- "
                         f"{s.std:.2f} | {s.min:.2f} | {s.max:.2f} | {s.failed} of {s.n} |")
        lines += ["", "| task | paired by seed | train FLOPs of each | mean difference | 95% "
                  "interval | Wilcoxon p |", "|---|---|---|---:|---|---:|"]
        by = {(r.name, r.arm): r for r in rows}
        for name in dict.fromkeys(r.name for r in rows):
            for a, b in (("electra", "mlm"), ("electra", "random init"), ("mlm", "random init")):
                if (name, a) in by and (name, b) in by and by[name, a].seeds == by[name, b].seeds:
                    c = compare_paired(by[name, a].scores, by[name, b].scores, (a, b))
                    p = "n/a" if c.wilcoxon_p is None else f"{c.wilcoxon_p:.3f}"
                    lines.append(f"| {name} | {a} - {b} | {flops[a]} / {flops[b]} | "
                                 f"{c.mean_difference:+.2f} | {c.low:+.2f}..{c.high:+.2f} | "
                                 f"{p} |")
    speed = os.environ.get("ELECTRA_SPEED")  # the speed parts the arms ran with
    lines += ["", f"wall time so far: {wall:.0f} s; seeds {args.seeds}; final model of each "
              f"fine-tuning run (none picked on dev); "
              f"{'ELECTRA_SPEED unset' if speed is None else f'ELECTRA_SPEED={speed}'}"]
    return "\n".join(lines) + "\n"


def plan_pretraining(args, per_update):
    """Each arm's updates for the same FLOPs, and the pace the clock asks of each."""
    flops = args.updates * per_update["electra"] if args.updates else args.flops
    updates = {arm: args.updates if arm == "electra" and args.updates else
               max(1, round(flops / per_update[arm])) for arm in per_update}
    plan = dict(flops=flops, flops_per_update=per_update, updates=updates)
    if args.pretrain_minutes:  # at least M minutes after a compile within C
        seconds = args.pretrain_minutes * 60
        plan["pace_needed"] = {arm: dict(
            updates_per_s=updates[arm] / seconds,
            tokens_per_s=updates[arm] * args.batch * args.length / seconds,
            flops_per_s=updates[arm] * per_update[arm] / seconds) for arm in updates}
        plan["compile_s_allowed"] = args.compile_minutes * 60
    return plan


def plan_lines(plan):
    lines = [f"plan: {plan['flops']:.3g} training FLOPs per arm: " + ", ".join(
        f"{arm} {plan['updates'][arm]:,} updates of {plan['flops_per_update'][arm]:.3g}"
        for arm in plan["updates"])]
    if "pace_needed" in plan:
        lines.append(f"pace for it: start-up and compile within {plan['compile_s_allowed']:.0f}"
                     f" s, then both arms at once at " + ", ".join(
                         f"{arm} {p['updates_per_s']:.3g} updates/s ({p['tokens_per_s']:,.0f} "
                         f"tokens/s, {p['flops_per_s']:.3g} FLOP/s)"
                         for arm, p in plan["pace_needed"].items()))
    return lines


def build_parser():
    p = command_parser(os.path.basename(__file__), __doc__)
    p.add_argument("--data", required=True, help="the binarized corpus (electra-prepare)")
    p.add_argument("--task", action="append", required=True, metavar="NAME=DIR",
                   help="a fine-tuning task and its prepared data (electra-glue preprocess); "
                        "repeat for more")
    p.add_argument("--out-dir", required=True,
                   help="where the results are written as they come")
    renamed(p, "--out", "--out-dir")
    p.add_argument("--work-dir", help="checkpoints and fine-tuning runs (default: OUT_DIR/work)")
    renamed(p, "--workdir", "--work-dir")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--flops", type=float, default=PAPER_POINT,
                        help="training FLOPs of each pre-trained arm (paper counting; default "
                             "8.9e16, the paper's 6.25%% point)")
    budget.add_argument("--updates", type=int, help="the electra arm's updates instead of "
                                                    "--flops (the mlm arm matches its FLOPs)")
    p.add_argument("--pretrain-minutes", type=float,
                   help="each arm's pre-training clock after its compile (default: none, the "
                        "planned updates)")
    p.add_argument("--compile-minutes", type=float, default=1.0,
                   help="with --pretrain-minutes: the start-up and compile an arm may take "
                        "before its clock counts down (default 1)")
    p.add_argument("--deadline-minutes", type=float,
                   help="stop an arm that has logged no update this long after its start; it "
                        "counts zero updates (default: --compile-minutes + --pretrain-minutes "
                        "+ 1)")
    p.add_argument("--preset", default="electra_small",
                   help="pre-training config of examples/pretraining/config")
    p.add_argument("--arch", default="electra_small", help="the network of every arm")
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
    finetune_length.add_argument("--finetune-updates", type=int,
                                 help="fine-tuning updates instead of epochs")
    p.add_argument("--log-interval", type=int, default=100,
                   help="updates between the pre-training's train_inner lines (its pace)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU (fp32)")
    p.add_argument("--graphed", action=argparse.BooleanOptionalAction,
                   help="pre-train with --graphed-step (default: on a GPU, not on the CPU)")
    return p


def parse_args(argv):
    p = build_parser()
    args = p.parse_args(argv)
    for name in ("updates", "jobs", "finetune_updates", "batch", "length", "log_interval"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} {value} must be at least 1")
    if args.updates is None and not args.flops > 0:
        p.error(f"--flops {args.flops:g} must be more than 0")
    for name in ("pretrain_minutes", "deadline_minutes"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            p.error(f"--{name.replace('_', '-')} {value:g} must be more than 0")
    if not args.compile_minutes >= 0:
        p.error(f"--compile-minutes {args.compile_minutes:g} must be 0 or more")
    if not 0 <= args.warmup < 1:
        p.error(f"--warmup {args.warmup:g} is not a fraction in [0, 1)")
    bad = [o for o in args.override if "=" not in o]
    if bad:
        p.error(f"--override {bad[0]!r} is not KEY=VALUE")
    args.data = os.path.abspath(args.data)
    args.out_dir = os.path.abspath(args.out_dir)
    args.work_dir = os.path.abspath(args.work_dir or os.path.join(args.out_dir, "work"))
    args.graphed = not args.cpu if args.graphed is None else args.graphed
    if args.deadline_minutes is None and args.pretrain_minutes:
        args.deadline_minutes = args.compile_minutes + args.pretrain_minutes + 1
    # a GPU takes every run of an arm at once (each a process of its own)
    runs = len(args.seeds) * len(args.task)
    args.jobs = args.jobs or (1 if args.cpu else min(runs, os.cpu_count() or 1))
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
    for directory in (args.out_dir, args.work_dir):
        os.makedirs(directory, exist_ok=True)
    pretrained, finetuned = {}, {}

    def write_table():
        table = comparison(args, pretrained, finetuned, time.time() - started)
        with written_whole(os.path.join(args.out_dir, "comparison.md")) as partial, \
                open(partial, "w") as f:
            f.write(table)
        return table

    def say(line):  # a pace line: printed, and appended to --out-dir/pace.txt
        line = f"{time.time() - started:5.0f} s  {line}"
        print(line, flush=True)
        with open(os.path.join(args.out_dir, "pace.txt"), "a") as f:
            f.write(line + "\n")

    overrides = [o.lstrip("+") for o in args.override]  # hydra's +key and ++key too
    model = [o for o in overrides if o.startswith("model.")]
    mask_prob = 0.15
    for o in overrides:
        if o.startswith("task.mask_prob="):
            mask_prob = float(o.split("=", 1)[1])
    configs = {arm: model_config(model, args.arch, arm) for arm in ("electra", "mlm")}
    plan = plan_pretraining(args, {arm: flops_per_update(cfg, args.data, args.length,
                                                         args.batch, mask_prob)
                                   for arm, cfg in configs.items()})
    write_json(os.path.join(args.out_dir, "plan.json"), dict(plan, arguments=vars(args)))
    for line in plan_lines(plan):
        say(line)

    pretrained.update(pretrain(args, plan, say))
    write_table()
    starts = {arm: trials.from_checkpoint(pretrained[arm]["checkpoint"], arm)
              for arm in ("electra", "mlm") if pretrained[arm]["checkpoint"]}
    made = [starts[arm].model_args for arm in ("electra", "mlm") if arm in starts]
    starts["random init"] = trials.random_init(made[0]) if made else \
        random_init_start(configs["electra"])
    for arm in ARMS:
        if arm in starts:  # an arm stopped before its first update has nothing to fine-tune
            finetuned[arm] = finetune(args, arm, starts[arm], tasks)
        table = write_table()
    print("\n" + table, flush=True)
    rows = [r for r in report.report_rows([r for f in finetuned.values()
                                           for r in f["results"]]) if r.judges]
    for row in rows:
        print(f"  {row.name:<10} {row.arm:<12} {format_summary(row.summary)}")
    failed = [f"{arm} ({p['ended']}; its console: {p['console']})"
              for arm, p in pretrained.items() if p["ended"].startswith("failed")]
    if failed:
        raise ElectraUsageError(f"pre-training failed: {', '.join(failed)}; the table holds "
                                f"the other arms")


if __name__ == "__main__":
    command_line(main)
