"""How many input shapes a fine-tuning epoch gives the encoder, with and without
``--length-buckets``, and what the padding costs in tokens: the batches of a binarized
sentence task's split, shuffled as fairseq-train shuffles them.

    python benchmarks/length_buckets.py DATA/input0 --batch-size 32 --buckets 0 8 16
"""

import argparse
import os

import numpy as np
from fairseq.data import Dictionary, data_utils

from electra_plugin.speed.buckets import bucket_length


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="a binarized input directory (dict.txt, SPLIT.bin/.idx)")
    p.add_argument("--split", default="train")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-positions", type=int, default=512)
    p.add_argument("--buckets", type=int, nargs="+", default=[0, 8, 16])
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    dictionary = Dictionary.load(os.path.join(args.data, "dict.txt"))
    dataset = data_utils.load_indexed_dataset(os.path.join(args.data, args.split), dictionary)
    sizes = np.asarray(dataset.sizes) + 1  # the <s> the sentence task puts first
    order = np.random.default_rng(args.seed).permutation(len(sizes))
    longest = [int(sizes[order[i:i + args.batch_size]].max())
               for i in range(0, len(sizes), args.batch_size)]
    print(f"{args.data} {args.split}: {len(sizes)} examples, lengths {sizes.min()}-"
          f"{sizes.max()} (median {np.median(sizes):.0f}), {len(longest)} batches of "
          f"{args.batch_size}")
    for buckets in args.buckets:
        lengths = [bucket_length(n, args.max_positions, buckets) for n in longest]
        print(f"--length-buckets {buckets}: {len(set(lengths))} shapes, "
              f"{sum(lengths) / sum(longest):.2f}x the tokens of each batch at its own length")


if __name__ == "__main__":
    main()
