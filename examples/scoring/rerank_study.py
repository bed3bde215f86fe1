#!/usr/bin/env python
"""Re-ranking study: `electra-score rerank` on real n-best lists of a small seq2seq system.

No translation data or model can be had on these machines, so the sequence-to-sequence task
is made from real English text: restoring case and punctuation. The source is a news
sentence lowercased with its punctuation removed (hyphens, dashes and slashes become spaces),
the target is the sentence itself. A tiny fairseq transformer learns it, its beam search
gives real n-best lists, and an Electric language model pre-trained on the same news text
(never on the dev/test documents) re-ranks them with `electra-score rerank`, the weight tuned
on dev only.

Steps (each prints its command; finished steps are reused on a re-run of the same --workdir):
  1. news articles (scripts/fetch_corpus.py news) -> documents; dev and test documents held
     out (--dev-size / --test-size sentences of 8-30 words each, none also a training
     sentence), --train-pairs training pairs from the other documents
  2. electra-prepare on the training documents' text (sentencepiece, --vocab-size pieces):
     the Electric LM's data and the one tokenizer; source and target encoded with it,
     fairseq-preprocess with its dict.txt as --srcdict and --tgtdict
  3. fairseq-train a 2+2-layer, 128-dim transformer (--mt-updates), fairseq-generate
     --beam/--nbest on dev and test (the S-, T- and H- lines kept)
  4. Electric pre-training (the small_compute preset with --objective electric --generator
     two_tower; a learning-rate schedule of --lm-updates, stopped at the end of epoch
     --lm-max-epoch: 659 updates on this data); optionally (--mlm-updates > 0) an
     --objective electra run of the same preset, whose generator gives the MLM
     pseudo-log-likelihood scorer
  5. electra-score score (timed) and electra-score rerank --weight-search on dev, applied to
     test; results.json

    # from the repository root: the run of examples/scoring/README.md
    OMP_NUM_THREADS=2 python examples/scoring/rerank_study.py --workdir work_dirs/rerank_study
    # with the MLM scorer as well (an electra run of the same schedule)
    python examples/scoring/rerank_study.py --workdir work_dirs/rerank_study --mlm-updates 1600
    # a smoke run in a minute or two
    python examples/scoring/rerank_study.py --workdir /tmp/rr --train-pairs 2000 \\
        --dev-size 40 --test-size 40 --mt-updates 30 --lm-updates 10 --mlm-updates 10
"""

import argparse
import json
import os
import platform
import random
import re
import shlex
import statistics
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PLUGIN = REPO / "electra_plugin"
GRID = ("0,0.001,0.002,0.003,0.005,0.0075,0.01,0.015,0.02,0.03,0.05,0.075,0.1,0.15,0.2,"
        "0.3,0.5,1")
# fairseq-generate with argparse.Namespace allowed in torch.load's weights-only unpickler:
# fairseq-train stores the legacy --arch's options as one in the checkpoint, which torch >= 2.6
# refuses by default (fairseq has no fix); the checkpoint is this study's own.
GENERATE = ("import argparse, sys, torch; torch.serialization.add_safe_globals([argparse.Namespace]); "
            "sys.argv[0] = 'fairseq-generate'; from fairseq_cli.generate import cli_main; cli_main()")


def log(message):
    print(f"[rerank_study] {message}", flush=True)


def run(cmd, log_path=None, threads=1, cwd=None, stdout_path=None):
    """Run ``cmd`` (printed first); its output into ``log_path``; -> wall seconds."""
    cmd = [str(c) for c in cmd]
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONUNBUFFERED="1")
    start = time.time()
    with open(log_path or os.devnull, "a") as err:
        out = open(stdout_path, "w") if stdout_path else err
        try:
            proc = subprocess.run(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        finally:
            if stdout_path:
                out.close()
    if proc.returncode:
        tail = Path(log_path).read_text().splitlines()[-8:] if log_path else []
        raise SystemExit(f"rerank_study: failed (exit {proc.returncode}; log {log_path}):\n"
                         + "\n".join(tail))
    return time.time() - start


# ------------------------------------------------------------------------- 1. the data

def normalize(line):
    return " ".join(unicodedata.normalize("NFKC", line).split())


def source_of(sentence):
    """Lowercased, hyphens/dashes/slashes as spaces, every other non-alphanumeric character
    removed, word-split."""
    text = re.sub(r"[-\u2010-\u2015/]", " ", sentence.lower())
    text = "".join(c for c in text if c.isalnum() or c.isspace())
    return " ".join(text.split())


def read_documents(path):
    docs, current = [], []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = normalize(line)
        if line:
            current.append(line)
        elif current:
            docs.append(current)
            current = []
    if current:
        docs.append(current)
    return docs


# the corpus's mangled characters: '"?' and '"' inside a word for a lost quote or apostrophe
# ('aren"t', 'similar"?to'), '?' before a word for a lost symbol ('?3.3m' for a pound sign)
MANGLED = re.compile(r'"\?|\w"\w|\?\w')


def eligible(sentence, min_words, max_words):
    """A sentence of 8-30 words, plain ASCII (no foreign or garbled text) and none of the
    corpus's mangled characters (MANGLED), so that its source and target tell the truth."""
    return (min_words <= len(sentence.split()) <= max_words and sentence.isascii()
            and not MANGLED.search(sentence) and bool(source_of(sentence)))


def make_splits(args, news, out):
    """Held-out dev/test documents; training pairs and LM text from the others.

    The corpus holds some articles twice (and stock lines such as bylines in many): a
    held-out sentence that any other document also holds is dropped, so that neither the
    translation model nor the language model has seen a dev or test sentence."""
    docs = read_documents(news)
    in_docs = {}
    for d, doc in enumerate(docs):
        for s in set(doc):
            in_docs[s] = in_docs.get(s, 0) + 1
    order = list(range(len(docs)))
    random.Random(args.seed).shuffle(order)
    ok = lambda s: eligible(s, args.min_words, args.max_words)  # noqa: E731
    stats = {"documents": len(docs)}
    splits, taken = {}, 0
    for name, size in (("test", args.test_size), ("dev", args.dev_size)):
        kept, dropped, n_docs = [], 0, 0
        while len(kept) < size:
            doc = docs[order[taken]]
            taken, n_docs = taken + 1, n_docs + 1
            for s in dict.fromkeys(s for s in doc if ok(s)):  # in order, once each
                if in_docs[s] > 1:
                    dropped += 1
                elif len(kept) < size:
                    kept.append(s)
        splits[name] = kept
        stats[f"{name}_documents"] = n_docs
        stats[f"{name}_dropped_as_in_other_documents"] = dropped
    train_docs = order[taken:]
    train_sentences = [s for d in train_docs for s in docs[d] if ok(s)]
    random.Random(args.seed).shuffle(train_sentences)
    splits["train"] = train_sentences[:args.train_pairs]
    stats.update(train_documents=len(train_docs), train_eligible_sentences=len(train_sentences))
    for name in ("train", "dev", "test"):
        sentences = splits[name]
        (out / f"{name}.raw.tgt").write_text("".join(s + "\n" for s in sentences))
        (out / f"{name}.raw.src").write_text("".join(source_of(s) + "\n" for s in sentences))
        stats[f"{name}_sentences"] = len(sentences)
    # the LM's text: every sentence of the training documents (an empty line between them)
    with open(out / "lm_train.txt", "w", encoding="utf-8") as f:
        for d in train_docs:
            f.write("".join(s + "\n" for s in docs[d]) + "\n")
    stats["lm_train_words"] = sum(len(s.split()) for d in train_docs for s in docs[d])
    held = set(splits["dev"]) | set(splits["test"])
    assert not held & {s for d in train_docs for s in docs[d]}, "a held-out sentence leaked"
    return stats


# ------------------------------------------------------------------------- the steps

def step1_data(args, wd, results):
    news = wd / "news.txt"
    if not news.exists():
        log("1. fetch the news articles")
        run([sys.executable, REPO / "scripts" / "fetch_corpus.py", "news", "--out", news],
            wd / "logs" / "fetch.log")
    raw = wd / "raw"
    stats_path = raw / "stats.json"
    if not stats_path.exists():
        log("1. split into held-out dev/test documents and training pairs")
        raw.mkdir(exist_ok=True)
        stats_path.write_text(json.dumps(make_splits(args, news, raw), indent=1))
    results["data"] = json.loads(stats_path.read_text())
    log(f"   data: {results['data']}")
    return raw


def step2_vocab(args, wd, raw, results):
    lm_bin = wd / "lm-bin"
    if not (lm_bin / "train.bin").exists():
        log("2. sentencepiece vocabulary and the LM's binarized data (electra-prepare)")
        results.setdefault("seconds", {})["electra_prepare"] = run(
            [BIN / "electra-prepare", "--train", raw / "lm_train.txt", "--out-dir", lm_bin,
             "--sentencepiece-vocab-size", args.vocab_size, "--workers", args.threads,
             "--seed", args.seed, "--force"], wd / "logs" / "prepare.log", args.threads)
    mt_bin = wd / "mt-bin"
    if not (mt_bin / "test.src-tgt.tgt.bin").exists():
        log("2. encode source/target with its tokenizer; fairseq-preprocess")
        sys.path.insert(0, str(REPO))
        from electra_plugin.data.tokenizer import load_tokenizer
        tokenizer = load_tokenizer(str(lm_bin))
        pieces = wd / "mt-pieces"
        pieces.mkdir(exist_ok=True)
        for split in ("train", "dev", "test"):
            for side in ("src", "tgt"):
                lines = (raw / f"{split}.raw.{side}").read_text(encoding="utf-8").splitlines()
                (pieces / f"{split}.{side}").write_text(
                    "".join(tokenizer.encode_line(line) + "\n" for line in lines))
        run([BIN / "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
             "--trainpref", pieces / "train", "--validpref", pieces / "dev",
             "--testpref", pieces / "test", "--srcdict", lm_bin / "dict.txt",
             "--tgtdict", lm_bin / "dict.txt", "--destdir", mt_bin,
             "--workers", args.threads], wd / "logs" / "preprocess.log", args.threads)
    return lm_bin, mt_bin


def step3_translate(args, wd, raw, mt_bin, results):
    save = wd / "mt"
    seconds = results.setdefault("seconds", {})
    if not (save / "checkpoint_last.pt").exists() or not (wd / "logs" / "mt_train.done").exists():
        log(f"3. train the transformer ({args.mt_updates} updates)")
        seconds["mt_train"] = run(
            [BIN / "fairseq-train", mt_bin, "--arch", "transformer",
             "--encoder-layers", 2, "--decoder-layers", 2, "--encoder-embed-dim", 128,
             "--decoder-embed-dim", 128, "--encoder-ffn-embed-dim", 512,
             "--decoder-ffn-embed-dim", 512, "--encoder-attention-heads", 4,
             "--decoder-attention-heads", 4, "--share-all-embeddings", "--dropout", 0.1,
             "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", args.mt_lr,
             "--lr-scheduler", "inverse_sqrt", "--warmup-updates",
             max(1, min(400, args.mt_updates // 5)), "--clip-norm", 1.0,
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", 0.1,
             "--max-tokens", args.mt_max_tokens, "--max-update", args.mt_updates,
             "--cpu", "--save-dir", save, "--no-epoch-checkpoints", "--save-interval",
             1000000, "--save-interval-updates", args.mt_updates, "--keep-interval-updates", 1,
             "--validate-interval", 1000000, "--validate-interval-updates", args.mt_updates,
             "--log-format", "simple", "--log-interval", 100, "--num-workers", 0,
             "--seed", args.seed], wd / "logs" / "mt_train.log", args.threads)
        (wd / "logs" / "mt_train.done").write_text(str(seconds["mt_train"]))
    seconds["mt_train"] = float((wd / "logs" / "mt_train.done").read_text())
    results["mt_valid"] = [line.split("|", 3)[-1].strip() for line in
                           (wd / "logs" / "mt_train.log").read_text().splitlines()
                           if "| valid on 'valid' subset" in line][-1:]
    generated = {}
    for name, subset in (("dev", "valid"), ("test", "test")):
        path = wd / f"{name}.gen.txt"
        if not path.exists():
            log(f"3. fairseq-generate --beam {args.beam} --nbest {args.nbest} on {name}")
            full = wd / f"{name}.gen.full.txt"
            seconds[f"generate_{name}"] = run(
                [sys.executable, "-c", GENERATE, mt_bin, "--path", save / "checkpoint_last.pt",
                 "--gen-subset", subset, "--beam", args.beam, "--nbest", args.nbest,
                 "--post-process", "sentencepiece", "--batch-size", 32, "--cpu",
                 # fairseq drops a last batch that is not a multiple of this (its issue 5036)
                 "--required-batch-size-multiple", 1,
                 "--num-workers", 0, "--seed", args.seed], wd / "logs" / f"gen_{name}.log",
                args.threads, stdout_path=full)
            keep_lines(full, path, raw, name)
        generated[name] = path
    return generated


def keep_lines(full, path, raw, name):
    """The S-, T- and H- lines; S-/T- replaced by the raw sentences (fairseq's own are the
    pieces decoded again, with <<unk>> for an unknown piece; the raw text is the truth)."""
    sources = (raw / f"{name}.raw.src").read_text(encoding="utf-8").splitlines()
    targets = (raw / f"{name}.raw.tgt").read_text(encoding="utf-8").splitlines()
    lines, unk = [], 0
    for line in full.read_text(encoding="utf-8").splitlines():
        kind = line[:2]
        if kind not in ("S-", "T-", "H-"):
            continue
        sentence = int(line.split("\t", 1)[0][2:])
        if kind == "S-":
            line = f"S-{sentence}\t{sources[sentence]}"
        elif kind == "T-":
            unk += "<<unk>>" in line
            line = f"T-{sentence}\t{targets[sentence]}"
        lines.append(line)
    translated = sum(line.startswith("S-") for line in lines)
    if translated != len(targets):
        raise SystemExit(f"rerank_study: {full} translates {translated} of the "
                         f"{len(targets)} sentences")
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    hyps = sum(line.startswith("H-") for line in lines)
    log(f"   {path}: {len(targets)} sentences, {hyps} hypotheses; "
        f"{unk} references had an unknown piece")


def pretrain(args, wd, lm_bin, name, objective, generator, updates, results):
    """The small_compute preset (examples/pretraining/config) with this objective."""
    save = wd / name
    done = wd / "logs" / f"{name}.done"
    if not done.exists():
        log(f"4. pre-train {name} ({objective}, {generator}, {updates} updates)")
        config = REPO / "examples" / "pretraining" / "config"
        seconds = run(
            [BIN / "fairseq-hydra-train", "--config-dir", config, "--config-name",
             "small_compute", f"task.data={lm_bin.resolve()}", f"common.user_dir={PLUGIN}",
             f"model.objective={objective}", f"model.generator={generator}",
             f"criterion.disc_weight={args.lm_disc_weight}",
             f"optimization.max_update={updates}", f"lr_scheduler.total_num_update={updates}",
             f"lr_scheduler.warmup_updates={max(1, updates // 10)}",
             f"checkpoint.save_dir={save.resolve()}",
             f"checkpoint.save_interval_updates={updates}",
             f"dataset.validate_interval_updates={updates}", f"common.seed={args.seed}",
             f"optimization.max_epoch={args.lm_max_epoch}",
             f"hydra.run.dir={(wd / 'hydra' / name).resolve()}"],
            wd / "logs" / f"{name}.log", args.threads, cwd=wd)
        done.write_text(str(seconds))
    train_lines = [line for line in (wd / "logs" / f"{name}.log").read_text().splitlines()
                   if "][train][INFO]" in line or "][valid][INFO]" in line]
    results[f"{name}_last_log"] = train_lines[-2:]
    # fairseq's own wall clock of the run (a resumed run's call takes only seconds)
    wall = re.search(r"\| wall (\d+)", [l for l in train_lines if "][train]" in l][-1])
    results.setdefault("seconds", {})[f"{name}_train"] = float(wall.group(1))
    return save / "checkpoint_last.pt"


def step5_rerank(args, wd, lm_bin, generated, name, checkpoint, scorer, results):
    """Score dev and test (timed), then rerank with the scores; -> its report."""
    out = results.setdefault("rerank", {}).setdefault(name, {})
    scores = {}
    for split, path in generated.items():
        tsv = wd / f"{split}.{name}.scores.tsv"
        stamp = wd / "logs" / f"score_{name}_{split}.seconds"
        if not stamp.exists():
            log(f"5. electra-score score --scorer {scorer} on {split}")
            stamp.write_text(str(run(
                [BIN / "electra-score", "score", "--checkpoint", checkpoint, "--pretrain-data", lm_bin,
                 "--input", path, "--scorer", scorer, "--cpu", "--out", tsv],
                wd / "logs" / f"score_{name}_{split}.log", args.threads)))
        hyps = len(Path(tsv).read_text().splitlines()) - 1
        sentences = len({line.split("\t")[0] for line in
                         Path(tsv).read_text().splitlines()[1:]})
        seconds = float(stamp.read_text())
        out[f"{split}_score_seconds"] = round(seconds, 2)
        out[f"{split}_ms_per_hypothesis"] = round(1000 * seconds / hyps, 2)
        out[f"{split}_ms_per_nbest_sentence"] = round(1000 * seconds / sentences, 1)
        scores[split] = tsv
    report = wd / f"rerank.{name}.json"
    run([BIN / "electra-score", "rerank", "--nbest", generated["dev"], "--lm-scores",
         scores["dev"], "--weight-search", "--grid", args.grid, "--test", generated["test"],
         "--test-lm-scores", scores["test"], "--out", wd / f"test.reranked.{name}.txt"],
        wd / "logs" / f"rerank_{name}.log", args.threads, stdout_path=report)
    lines = report.read_text().splitlines()
    print("\n".join(lines), flush=True)
    out.update(json.loads(lines[-1]))
    out.update(bounds(generated, scores))
    if name == "electric":  # the one-command form: the checkpoint scores both sets itself
        one = wd / f"rerank.{name}.checkpoint.json"
        if not one.exists():
            seconds = run([BIN / "electra-score", "rerank", "--checkpoint", checkpoint,
                           "--pretrain-data", lm_bin, "--scorer", scorer, "--cpu", "--nbest",
                           generated["dev"], "--weight-search", "--grid", args.grid, "--test",
                           generated["test"]], wd / "logs" / f"rerank_{name}_checkpoint.log",
                          args.threads, stdout_path=one)
            (wd / "logs" / f"rerank_{name}_checkpoint.seconds").write_text(str(seconds))
        direct = json.loads(one.read_text().splitlines()[-1])
        out["checkpoint_form_seconds"] = round(float(
            (wd / "logs" / f"rerank_{name}_checkpoint.seconds").read_text()), 1)
        out["checkpoint_form_same_report"] = all(
            direct[k] == out[k] for k in direct)
    return out


def bounds(generated, scores):
    """Context for the numbers (diagnostics, not electra-score's): the n-best oracle (per
    sentence the hypothesis of the best sentence BLEU); the language model alone (its best
    hypothesis, the translation score only breaking ties); how often the reference itself is
    in the list and who picks it; and the language score per sentencepiece piece instead of
    summed (electra-score sums), its weight tuned on dev the same way."""
    sys.path.insert(0, str(REPO))
    import sacrebleu
    from electra_plugin.data.tokenizer import load_tokenizer
    from electra_plugin.finetuning import scoring
    tokenizer = load_tokenizer(str(Path(generated["dev"]).parent / "lm-bin"))
    out, lists = {}, {}
    for split, path in generated.items():
        nbest = scoring.read_input(str(path), "generate")
        language = scoring.read_scores(str(scores[split]), nbest)
        pieces = [max(1, len(tokenizer.pieces(h.text))) for h in nbest.hypotheses]
        per_piece = [score / n for score, n in zip(language, pieces)]
        lists[split] = nbest, per_piece
        best = {}
        for hyp in nbest.hypotheses:
            bleu = sacrebleu.sentence_bleu(hyp.text, [nbest.references[hyp.id]]).score
            if hyp.id not in best or bleu > best[hyp.id][0]:
                best[hyp.id] = (bleu, hyp)
        out[f"{split}_oracle_bleu"] = round(
            scoring.corpus_bleu(nbest, {i: h for i, (_, h) in best.items()}), 4)
        lm_only = scoring.rerank(nbest, language, 1e6)
        mt_only = scoring.rerank(nbest, language, 0)
        out[f"{split}_lm_only_bleu"] = round(scoring.corpus_bleu(nbest, lm_only), 4)
        has_ref = {h.id for h in nbest.hypotheses if h.text == nbest.references[h.id]}
        out[f"{split}_reference_in_nbest"] = len(has_ref)
        out[f"{split}_reference_picked_by_mt"] = sum(mt_only[i].text == nbest.references[i]
                                                     for i in has_ref)
        out[f"{split}_reference_picked_by_lm_only"] = sum(
            lm_only[i].text == nbest.references[i] for i in has_ref)
        out[f"{split}_corr_language_score_vs_pieces"] = round(
            statistics.correlation(language, pieces), 3)
    grid = [0, 0.03, 0.1, 0.3, 1, 3, 10]
    weight, table = scoring.weight_search(*lists["dev"], grid)
    out["per_piece_grid_dev"] = [[w, round(b, 4)] for w, b in table]
    out["per_piece_weight"] = weight
    out["per_piece_test_bleu_after"] = round(scoring.corpus_bleu(
        lists["test"][0], scoring.rerank(*lists["test"], weight)), 4)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--workdir", type=Path, default=REPO / "work_dirs" / "rerank_study")
    p.add_argument("--train-pairs", type=int, default=40000)
    p.add_argument("--dev-size", type=int, default=500)
    p.add_argument("--test-size", type=int, default=500)
    p.add_argument("--min-words", type=int, default=8)
    p.add_argument("--max-words", type=int, default=30)
    p.add_argument("--vocab-size", type=int, default=8000, help="sentencepiece pieces")
    p.add_argument("--mt-updates", type=int, default=1200,
                   help="translation model updates (about 10 minutes on 2 cores)")
    p.add_argument("--mt-lr", type=float, default=2e-3)
    p.add_argument("--mt-max-tokens", type=int, default=4096)
    p.add_argument("--beam", type=int, default=8)
    p.add_argument("--nbest", type=int, default=8)
    p.add_argument("--lm-updates", type=int, default=1600,
                   help="Electric pre-training updates of the learning-rate schedule (1600: "
                        "about 10 minutes on 2 idle cores)")
    p.add_argument("--lm-max-epoch", type=int, default=1,
                   help="also stop both LM runs at the end of this epoch (0: no limit; 1: "
                        "659 updates on the news text); the learning-rate schedule stays the "
                        "one of --lm-updates / --mlm-updates")
    p.add_argument("--lm-disc-weight", type=float, default=1.0,
                   help="criterion.disc_weight (the small_compute preset's 1.0)")
    p.add_argument("--mlm-updates", type=int, default=0,
                   help="updates of an --objective electra run (same preset, same data) whose "
                        "generator gives the MLM scorer (0: no MLM scorer)")
    p.add_argument("--grid", default=GRID, help="weights tried on dev")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", 2)))
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    wd = args.workdir.resolve()
    (wd / "logs").mkdir(parents=True, exist_ok=True)
    start = time.time()
    results = {"args": {k: str(v) for k, v in vars(args).items()},
               "machine": f"{platform.processor() or platform.machine()}, "
                          f"{os.cpu_count()} CPUs visible, {args.threads} threads"}
    raw = step1_data(args, wd, results)
    lm_bin, mt_bin = step2_vocab(args, wd, raw, results)
    generated = step3_translate(args, wd, raw, mt_bin, results)
    electric = pretrain(args, wd, lm_bin, "electric", "electric", "two_tower",
                        args.lm_updates, results)
    step5_rerank(args, wd, lm_bin, generated, "electric", electric, "electric", results)
    if args.mlm_updates > 0:
        electra = pretrain(args, wd, lm_bin, "electra", "electra", "masked_lm",
                           args.mlm_updates, results)
        step5_rerank(args, wd, lm_bin, generated, "electra_mlm", electra, "mlm", results)
    results["seconds"]["this_invocation"] = round(time.time() - start, 1)
    (wd / "results.json").write_text(json.dumps(results, indent=1))
    log(f"wrote {wd / 'results.json'}")


if __name__ == "__main__":
    main()
