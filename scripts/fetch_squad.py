#!/usr/bin/env python
"""Real SQuAD-format data from a package registry: the squad_shifts files of the
bigbench==1.0.0 sdist (new_wiki, nyt, reddit, amazon_reviews, and the real SQuAD v1.1 dev
set), cached under --cache-dir; prints the directory that holds them.

    python scripts/fetch_squad.py [--cache-dir DIR] [--sdist bigbench-1.0.0.tar.gz]

Then ``electra-squad split`` / ``preprocess`` (see examples/squad/README.md).
"""

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

from registry import default_cache_dir, log

from electra_plugin.cli.vocabulary import HelpFormatter
from electra_plugin.user_io.errors import ElectraUsageError, command_line

BIGBENCH = "bigbench==1.0.0"
SHIFTS_DIR = "bigbench/benchmark_tasks/squad_shifts/"
SHIFTS_FILES = ("new_wiki_v1.0.json", "nyt_v1.0.json", "reddit_v1.0.json",
                "amazon_reviews_v1.0.json", "squaddev_v1.1.json")


def _extract_from_tar(tar_path, dest):
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            name = os.path.basename(member.name)
            if SHIFTS_DIR in member.name and name in SHIFTS_FILES and member.isfile():
                with tar.extractfile(member) as src, open(os.path.join(dest, name), "wb") as out:
                    shutil.copyfileobj(src, out)


def fetch(args):
    dest = os.path.abspath(args.cache_dir)
    have = lambda: all(os.path.isfile(os.path.join(dest, f)) for f in SHIFTS_FILES)  # noqa
    if have() and not args.force:
        log(f"cached: {dest}")
        print(dest)
        return 0
    os.makedirs(dest, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".fetch-", dir=dest)
    try:
        if args.sdist:
            _extract_from_tar(args.sdist, work)
        else:
            # bigbench's setup declares a direct-URL dependency, so pip stops after unpacking
            # the sdist ("cannot declare direct URL dependencies") and keeps no archive even
            # with --no-deps (registry.fetch_package fails on it for that
            # reason); --no-clean leaves the unpacked tree in our TMPDIR instead.
            log(f"pip download --no-deps --no-binary :all: {BIGBENCH} (about 360 MB, once)")
            env = dict(os.environ, TMPDIR=work)
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--no-clean", "--disable-pip-version-check", BIGBENCH, "-d",
                   os.path.join(work, "dl")]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            archives = glob.glob(os.path.join(work, "dl", "bigbench-*.tar.gz"))
            if archives:
                _extract_from_tar(archives[0], work)
            else:
                for name in SHIFTS_FILES:
                    found = glob.glob(os.path.join(work, "pip-*", "*", SHIFTS_DIR, name))
                    if found:
                        shutil.copyfile(found[0], os.path.join(work, name))
            if not all(os.path.isfile(os.path.join(work, f)) for f in SHIFTS_FILES):
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                raise ElectraUsageError(f"could not get the squad_shifts files of {BIGBENCH} "
                                        f"with pip: {tail[0]}")
        missing = [f for f in SHIFTS_FILES if not os.path.isfile(os.path.join(work, f))]
        if missing:
            raise ElectraUsageError(f"{args.sdist} lacks {SHIFTS_DIR}{missing[0]}")
        provenance = {}
        for name in SHIFTS_FILES:
            with open(os.path.join(work, name), "rb") as f:
                provenance[name] = hashlib.sha256(f.read()).hexdigest()
            os.replace(os.path.join(work, name), os.path.join(dest, name))
        with open(os.path.join(dest, "SOURCE.json"), "w") as f:
            json.dump({"package": BIGBENCH, "path": SHIFTS_DIR, "sha256": provenance}, f,
                      indent=2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"wrote {len(SHIFTS_FILES)} SQuAD files to {dest}")
    print(dest)
    return 0


def build_parser():
    cache = os.path.join(default_cache_dir(), "squad_shifts")  # $ELECTRA_CACHE/squad_shifts
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--cache-dir", default=cache, help=f"default {cache}")
    p.add_argument("--sdist", help="use this bigbench-1.0.0.tar.gz instead of pip download")
    p.add_argument("--force", action="store_true", help="fetch again even if cached")
    return p


def main(argv=None):
    return fetch(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(command_line(main))
