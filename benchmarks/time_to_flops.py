#!/usr/bin/env python
"""When did a pre-training run reach a given amount of training compute?

Reads a fairseq-train / fairseq-hydra-train log of the ``electra`` criterion (simple or json
format, stdout or ``--log-file``), whose ``train_inner`` lines carry ``train_flops`` (the
running total, counted as the paper counts training FLOPs) and ``wall`` (seconds since the
start, carried over on resume), and prints the first logged update at or past each target.

    python benchmarks/time_to_flops.py pretrain.log 1e15 8.9e16
"""

import argparse
import json
import re
import sys

SIMPLE = re.compile(r"(\w+)=([-+0-9.eE]+)")


def records(lines):
    """(num_updates, train_flops, wall) of every train_inner line that has train_flops."""
    for line in lines:
        if "train_inner" not in line:
            continue
        if "{" in line:
            values = json.loads(line[line.index("{"):])
        else:
            values = dict(SIMPLE.findall(line))
        if "train_flops" in values:
            yield (int(float(values["num_updates"])), float(values["train_flops"]),
                   float(values.get("wall", "nan")))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", type=argparse.FileType())
    p.add_argument("flops", type=float, nargs="+", help="targets, e.g. 8.9e16")
    args = p.parse_args(argv)
    rows = list(records(args.log))
    if not rows:
        sys.exit(f"{args.log.name}: no train_inner line with train_flops (is it a log of "
                 f"the electra criterion?)")
    for target in args.flops:
        hit = next((r for r in rows if r[1] >= target), None)
        if hit is None:
            print(f"{target:.3g} FLOPs: not reached (last: {rows[-1][1]:.3g} at update "
                  f"{rows[-1][0]}, {rows[-1][2]:.0f} s)")
        else:
            print(f"{target:.3g} FLOPs: update {hit[0]}, {hit[2]:.0f} s wall "
                  f"({hit[2] / 3600:.2f} h), {hit[1]:.4g} FLOPs")


if __name__ == "__main__":
    main()
