"""Fine-tuning evaluated as the paper evaluates it.

Subcommands:
  trials        fine-tune a checkpoint (or a random initialisation of an --arch) on each
                task (any directory a preparation command wrote: sentence classification or
                regression, tagging, SQuAD-format QA, multiple choice, or a kind of your own
                from --user-dir) with N seeds, one fairseq-train command per run (printed),
                evaluate every final model (or, --keep best, the best on dev) by the task's
                own metric, and report per task the median (the paper's statistic), mean,
                std, min/max and the runs that never left the constant-prediction level, an
                average over the tasks and the GLUE score; writes trials.json and trials.md
                (and trials.png). A re-run skips the trials that finished.
  test-outputs  a fine-tuned checkpoint's predictions on its data's test split(s) as the
                task's benchmark reads them (GLUE's RTE.tsv, MNLI-m.tsv, AX.tsv ...; CoNLL
                for tagging; predictions.json for SQuAD)

Examples:
  electra-finetune trials --checkpoint ck/checkpoint_last.pt --task RTE=data-bin/RTE \\
      --task ner=data-bin/my-ner --trials 10 --out-dir trials/electra-small
  electra-finetune trials --checkpoint ck/checkpoint_last.pt --suite suite.yaml --trials 5 \\
      --picture --out-dir trials/suite
  electra-finetune trials --arch electra_small --task RTE=data-bin/RTE --trials 10 \\
      --out-dir trials/random-init
  electra-finetune test-outputs --checkpoint trials/.../checkpoint_last.pt \\
      --data data-bin/MNLI --out-dir glue-submission
"""

import os
import shlex

from electra_plugin.cli.command import console, subcommands
from electra_plugin.cli.vocabulary import command_parser, renamed, subcommand
from electra_plugin.finetuning import report
from electra_plugin.finetuning import trials as tr
from electra_plugin.finetuning.suite import read_suite, with_overrides
from electra_plugin.user_io.errors import ElectraUsageError


def run_trials(args):
    # the plan is checked before anything runs: counts, tasks, checkpoint, then (tr.plan)
    # the task names, each task's data and its dictionary against the checkpoint's
    if args.seeds is None and args.trials < 1:
        raise ElectraUsageError(f"--trials {args.trials} must be at least 1")
    if args.jobs < 1:
        raise ElectraUsageError(f"--jobs {args.jobs} must be at least 1")
    seeds = tr.check_seeds(args.seeds or range(1, args.trials + 1))
    user_dir = tr.PLUGIN
    if args.user_dir:  # a module of one's own kinds (it imports electra_plugin)
        user_dir = os.path.abspath(args.user_dir)
        import_user_dir(user_dir)
    recipe = tr.Recipe(lr=args.lr, layer_decay=args.layer_decay, epochs=args.epochs,
                       max_update=args.max_update, batch_size=args.batch_size,
                       cpu=args.cpu, keep=args.keep, user_dir=user_dir,
                       extra=tuple(args.fairseq_options))
    specs = [(spec, {}) for spec in args.task or []]
    if args.suite:
        specs += [(f"{name}={data}", changes) for name, data, changes in read_suite(args.suite)]
    if not specs:
        raise ElectraUsageError("give the tasks: --task NAME=DIR (repeated) or --suite FILE")
    tasks = [tr.parse_task(spec) for spec, _ in specs]
    recipes = {task.name: with_overrides(recipe, changes)
               for task, (_, changes) in zip(tasks, specs)}
    if args.checkpoint and args.arch:
        raise ElectraUsageError("give --checkpoint (fine-tune its discriminator) or --arch (a "
                                "random initialisation), not both")
    if args.checkpoint:
        start = tr.from_checkpoint(args.checkpoint, args.label or "pre-trained")
    elif args.arch:
        start = tr.random_init(["--arch", args.arch, *args.model_options],
                               args.label or "random init")
    else:
        raise ElectraUsageError("give --checkpoint CHECKPOINT or --arch ARCH (random "
                                "initialisation)")
    trials = tr.plan(tasks, start, seeds, args.out_dir, recipes=recipes)
    results = tr.run_trials(trials, recipe, jobs=args.jobs)
    rows = report.report_rows(results)
    report.print_rows(rows)
    paths = report.write_report(rows, results, args.out_dir, picture=args.picture)
    arm = trials[0].arm
    average, glue = report.suite_average(rows, arm), report.glue_score(rows, arm)
    if average:
        print(f"average of the task medians ({average[1]} tasks): {average[0]:.2f}")
    if glue:
        print(f"GLUE score (mean of the task medians, {glue[1]} tasks): {glue[0]:.2f}")
    print(f"wrote {', '.join(paths)}")
    return rows


def import_user_dir(path):
    """Imports a --user-dir module as fairseq-train will, so its kinds are registered."""
    import argparse

    from fairseq import utils

    if not os.path.isdir(path):
        raise ElectraUsageError(f"--user-dir {path} is not a directory (a Python package of "
                                f"your own kinds, as fairseq's --user-dir)")
    utils.import_user_module(argparse.Namespace(user_dir=path))


def test_outputs(args):
    from electra_plugin.finetuning.kinds import write_test_outputs

    for path in write_test_outputs(args.checkpoint, args.data, args.out_dir, args.cpu):
        print(f"wrote {path}")


def build_parser():
    p = command_parser("electra-finetune", __doc__)
    sub = p.add_subparsers(dest="command", required=True)

    t = subcommand(sub, "trials", "N fine-tuning runs per task, median first")
    t.add_argument("--task", action="append", metavar="NAME=DIR",
                   help="a task's name and the directory a preparation command wrote "
                        "(electra-glue, -tag, -squad or -choice preprocess); a GLUE name "
                        "(CoLA ... WNLI) keeps the official recipe; repeat for several tasks")
    t.add_argument("--suite", help="a YAML file of tasks (NAME: DIR, or NAME: {data: DIR, "
                                   "epochs: ...}), added to the --task ones")
    t.add_argument("--keep", choices=tr.KEEP, default="final",
                   help="the model evaluated: the final one (the paper's) or the best on dev "
                        "by the task's metric (validated each epoch; its tables say so)")
    t.add_argument("--picture", action="store_true",
                   help="also trials.png: every run per task and arm, the median marked "
                        "(the plots extra)")
    t.add_argument("--user-dir", help="a Python package of your own fine-tuning kinds "
                                      "(fairseq's --user-dir; it imports electra_plugin)")
    t.add_argument("--checkpoint", help="pre-training (or discriminator) checkpoint")
    t.add_argument("--arch", help="fine-tune a random initialisation of this architecture")
    t.add_argument("--model-options", type=shlex.split, default=[],
                   help="with --arch: model options for fairseq-train, one quoted string "
                        "(--model-options='--num-layers 2 --hidden-size 64')")
    t.add_argument("--label", help="the arm's name in the tables (default: pre-trained or "
                                   "random init)")
    t.add_argument("--trials", type=int, default=10,
                   help="seeds 1..N (default 10, the paper's appendix)")
    t.add_argument("--seeds", type=int, nargs="+", help="these seeds instead of 1..--trials")
    t.add_argument("--out-dir", required=True,
                   help="each run in OUT_DIR/TASK/seed-S; trials.json and trials.md here")
    t.add_argument("--lr", type=float, help="default: the size's official lr (Small 3e-4, "
                                            "Base 1e-4, Large 5e-5)")
    t.add_argument("--layer-decay", type=float,
                   help="layer-wise lr decay (default: 0.8 Small/Base, 0.9 Large)")
    t.add_argument("--epochs", type=float,
                   help="default: official (3; 10 for RTE and STS-B; 2 for SQuAD)")
    t.add_argument("--max-update", type=int, help="updates per run instead of --epochs")
    t.add_argument("--batch-size", type=int, default=32, help="sequences per update")
    t.add_argument("--jobs", type=int, default=1,
                   help="runs at once, each with cores/jobs threads (default 1)")
    t.add_argument("--cpu", action="store_true", help="train and evaluate on the CPU")
    t.add_argument("--fairseq-options", type=shlex.split, default=[],
                   help="more fairseq-train options for every run, one quoted string "
                        "(--fairseq-options='--dropout 0.2'); they come last and win")
    renamed(t, "--workdir", "--out-dir")
    t.set_defaults(run=run_trials)

    o = subcommand(sub, "test-outputs", "test-set predictions as the benchmark reads them")
    o.add_argument("--checkpoint", required=True, help="a fine-tuned checkpoint of the task")
    o.add_argument("--data", required=True,
                   help="the task's prepared data, with its test split(s)")
    o.add_argument("--out-dir", required=True,
                   help="writes the benchmark's files here (RTE.tsv, MNLI-m.tsv, AX.tsv ...; "
                        "test.conll; predictions.json; test.choices)")
    o.add_argument("--cpu", action="store_true", help="predict on the CPU")
    o.set_defaults(run=test_outputs)
    return p


main = subcommands(build_parser)
cli = console(main)


if __name__ == "__main__":
    cli()
