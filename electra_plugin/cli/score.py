"""Sentence scores from a pre-trained checkpoint, and n-best re-ranking with them.

Subcommands:
  score   plain text (a sentence per line) or fairseq-generate output (its H- lines) -> a
          TSV row per hypothesis, in the input's order: id, hypothesis index, translation
          score (nan for plain text), language score
  rerank  fairseq-generate n-best lists: the hypothesis of the best translation score +
          w * language score per sentence, w given or tuned on --nbest by corpus BLEU over a
          grid; BLEU (sacrebleu, against the T- lines) before and after

Scorers: --scorer electric (one pass: -sum of the discriminator_head's energies over the
real tokens; any checkpoint with a discriminator_head) and --scorer mlm (pseudo-log-
likelihood: one pass per token through the checkpoint's masked LM, the generator of an
electra checkpoint or an --objective mlm model). See docs/objectives.md, "Scoring
sentences".

Examples:
  electra-score score --checkpoint ck/checkpoint_best.pt --pretrain-data data-bin/news \\
      --input hyps.txt --scorer electric --out hyps.scores.tsv
  electra-score rerank --checkpoint ck/checkpoint_best.pt --pretrain-data data-bin/news \\
      --nbest dev.gen.txt --weight-search --test test.gen.txt --out test.reranked.txt
  electra-score rerank --nbest dev.gen.txt --lm-scores dev.scores.tsv --weight-search \\
      --test test.gen.txt --test-lm-scores test.scores.tsv
"""

import logging
import os
import sys

from electra_plugin.cli.command import console, subcommands
from electra_plugin.cli.vocabulary import (add_json, command_parser, print_result,
                                           renamed, subcommand)
from electra_plugin.finetuning import scoring
from electra_plugin.user_io.errors import ElectraUsageError
from electra_plugin.user_io.partial_output import written_whole

logger = logging.getLogger(__name__)
DEFAULT_GRID = "0,0.001,0.002,0.005,0.01,0.02,0.05,0.1,0.2,0.5,1"


def load_scorer(args):
    """-> texts -> language scores, with the checkpoint on the chosen device."""
    from electra_plugin.data.evaluation import inference_device
    from electra_plugin.models.hub_interface import from_pretrained

    scoring.check_checkpoint(args.checkpoint, args.scorer)  # its kind before the data
    if not args.pretrain_data:
        raise ElectraUsageError("give --pretrain-data, the pre-training data directory "
                                "(dict.txt and the tokenizer), with --checkpoint")
    checkpoint = os.path.abspath(args.checkpoint)
    data = os.path.abspath(args.pretrain_data)
    hub = from_pretrained(os.path.dirname(checkpoint), os.path.basename(checkpoint), data)
    scoring.read_plain_data_as_tokens(hub, data)
    device = inference_device(args.cpu)
    hub.model.to(device)
    logger.info(f"scoring with --scorer {args.scorer} on {device.type}")
    return scoring.text_scorer(hub, args.scorer, args.batch_size)


def score(args):
    nbest = scoring.read_input(args.input, args.format)
    scores = load_scorer(args)([h.text for h in nbest.hypotheses])
    if args.out:
        with written_whole(args.out) as partial, open(partial, "w", encoding="utf-8") as f:
            scoring.write_scores(f, nbest, scores)
        logger.info(f"wrote {len(scores)} scores to {args.out}")
    else:
        scoring.write_scores(sys.stdout, nbest, scores)
    return scores


def parse_grid(text):
    try:
        return [float(w) for w in text.split(",")]
    except ValueError:
        raise ElectraUsageError(f"--grid {text!r} is not a comma-separated list of "
                                f"weights") from None


def rerank(args):
    if args.weight_search == (args.weight is not None):
        raise ElectraUsageError("give --weight-search (tune w on --nbest) or --weight W")
    if (args.checkpoint is None) == (args.lm_scores is None):
        raise ElectraUsageError("give --checkpoint (and --data) to score the hypotheses, or "
                                "--lm-scores with the scores electra-score score wrote")
    grid = parse_grid(args.grid) if args.weight_search else None
    if args.test_lm_scores and not (args.test and args.lm_scores):
        raise ElectraUsageError("--test-lm-scores goes with --test and --lm-scores")
    sets = [("nbest", args.nbest, args.lm_scores)]
    if args.test:
        if args.lm_scores and not args.test_lm_scores:
            raise ElectraUsageError("give --test-lm-scores for --test too, or score both "
                                    "with --checkpoint")
        sets.append(("test", args.test, args.test_lm_scores))
    scorer = load_scorer(args) if args.checkpoint else None
    lists = {}
    for name, path, scores_path in sets:
        nbest = scoring.read_input(path, "generate")
        lists[name] = nbest, (scoring.read_scores(scores_path, nbest) if scores_path else
                              scorer([h.text for h in nbest.hypotheses]))
    weight = args.weight
    report = {}
    if args.weight_search:
        weight, table = scoring.weight_search(*lists["nbest"], grid)
        print(f"weight grid on {args.nbest} (corpus BLEU):")
        for w, bleu in table:
            print(f"  w={w:<8g} BLEU {bleu:6.2f}{'  <- best' if w == weight else ''}")
        report["grid"] = [[w, round(bleu, 4)] for w, bleu in table]
    report["weight"] = weight
    for name, (nbest, language) in lists.items():
        for when, w in (("before", 0.0), ("after", weight)):
            report[f"{name}_bleu_{when}"] = round(
                scoring.corpus_bleu(nbest, scoring.rerank(nbest, language, w)), 4)
    if args.out:
        nbest, language = lists["test" if args.test else "nbest"]
        chosen = scoring.rerank(nbest, language, weight)
        with written_whole(args.out) as partial, open(partial, "w", encoding="utf-8") as f:
            f.writelines(chosen[i].text + "\n" for i in sorted(chosen))
        logger.info(f"wrote {len(chosen)} re-ranked hypotheses to {args.out}")
    print_result(report, args.json, "re-ranking")
    return report


def add_model_options(p, required):
    p.add_argument("--checkpoint", required=required, help="a pre-training checkpoint")
    p.add_argument("--pretrain-data", help="its pre-training data directory (dict.txt and "
                                           "electra-prepare's tokenizer; without one, the "
                                           "input is read as whitespace tokens of dict.txt)")
    p.add_argument("--scorer", choices=scoring.SCORERS, default="electric",
                   help="electric: one pass, -sum of the energies; mlm: pseudo-log-"
                        "likelihood, a pass per token (default: electric)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="sequences per forward pass (mlm: masked copies)")
    p.add_argument("--cpu", action="store_true", help="do not use a GPU")
    renamed(p, "--data", "--pretrain-data")


def build_parser():
    p = command_parser("electra-score", __doc__)
    sub = p.add_subparsers(dest="command", required=True)
    ps = subcommand(sub, "score", "a language score per sentence or hypothesis")
    add_model_options(ps, required=True)
    ps.add_argument("--input", required=True,
                    help="plain text (a sentence per line) or fairseq-generate output")
    ps.add_argument("--format", choices=("auto", "text", "generate"), default="auto",
                    help="auto: fairseq-generate output when a line starts with H-<id>")
    ps.add_argument("--out", help="write the TSV here (default: standard output)")
    ps.set_defaults(run=score)
    pr = subcommand(sub, "rerank", "re-rank fairseq-generate n-best lists")
    add_model_options(pr, required=False)
    pr.add_argument("--nbest", required=True,
                    help="fairseq-generate output (--nbest N); with --weight-search, the dev "
                         "set w is tuned on")
    pr.add_argument("--weight-search", action="store_true",
                    help="tune w on --nbest by corpus BLEU over --grid")
    pr.add_argument("--grid", default=DEFAULT_GRID, help=f"weights tried (default: "
                                                         f"{DEFAULT_GRID})")
    pr.add_argument("--weight", type=float, help="w, without a search")
    pr.add_argument("--test", help="fairseq-generate output to re-rank with the weight")
    pr.add_argument("--lm-scores", help="electra-score score's TSV of --nbest, instead of "
                                        "--checkpoint")
    pr.add_argument("--test-lm-scores", help="electra-score score's TSV of --test")
    pr.add_argument("--out", help="write the re-ranked 1-best of --test (else --nbest), a "
                                  "line per sentence in id order")
    add_json(pr)
    pr.set_defaults(run=rerank)
    return p


main = subcommands(build_parser)
cli = console(main)


if __name__ == "__main__":
    cli()
