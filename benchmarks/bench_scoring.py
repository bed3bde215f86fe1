#!/usr/bin/env python3
"""Sentence-scoring speed on CPU: Electric's one pass against the masked LM's pass per token.

Random electra_small-sized models (no download; vocabulary 30522), the scorers of
``electra-score`` (electra_plugin.finetuning.scoring) on random sentences of each length
(real tokens, between <s> and </s>):

  electric        one pass of the discriminator + discriminator_head
  mlm generator   pseudo-log-likelihood through an electra checkpoint's generator (1/4 width)
  mlm full        pseudo-log-likelihood through an --objective mlm model (the discriminator's
                  size): the same network as electric, a pass per token

Prints sentences/s (best of --repeats, after a warm-up) and electric's speed over each mlm's.

  OMP_NUM_THREADS=1 python benchmarks/bench_scoring.py [--lengths 16 32 64] [--sentences 32]
"""

import argparse
import time

import torch
from fairseq.data import Dictionary
from omegaconf import OmegaConf

from electra_plugin.finetuning.scoring import SentenceScorer
from electra_plugin.models.electra import ElectraModel
from electra_plugin.tasks.electra_pretraining import (ElectraPretrainingConfig,
                                                      ElectraPretrainingTask)


def small_model(vocab, objective):
    dictionary = Dictionary()
    for i in range(vocab - len(dictionary) - 1):  # <mask> is the task's
        dictionary.add_symbol(f"w{i}")
    task = ElectraPretrainingTask(ElectraPretrainingConfig(data="unused", tokens_per_sample=128,
                                                           seed=1), dictionary)
    torch.manual_seed(0)
    model = ElectraModel.build_model(OmegaConf.create({"_name": "electra_small",
                                                       "objective": objective}), task)
    return model, task


def sentences(task, count, length, seed):
    g = torch.Generator().manual_seed(seed)
    d = task.dictionary
    inner = torch.randint(d.nspecial, len(d) - 1, (count, length), generator=g)
    return [torch.cat([torch.tensor([d.bos()]), row, torch.tensor([d.eos()])]) for row in inner]


def sentences_per_s(scorer, rows, repeats):
    scorer(rows[:2])  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        scorer(rows)
        best = min(best, time.perf_counter() - start)
    return len(rows) / best


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--sentences", type=int, default=32, help="per length and scorer")
    p.add_argument("--batch-size", type=int, default=64, help="sequences per forward pass")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vocab", type=int, default=30522)
    args = p.parse_args()
    electra, task = small_model(args.vocab, "electra")
    mlm, _ = small_model(args.vocab, "mlm")
    scorers = {"electric": SentenceScorer(electra, "electric", batch_size=args.batch_size),
               "mlm generator": SentenceScorer(electra, "mlm", task.mask_idx, args.batch_size),
               "mlm full": SentenceScorer(mlm, "mlm", task.mask_idx, args.batch_size)}
    print(f"electra_small, vocabulary {args.vocab}, {torch.get_num_threads()} thread(s), "
          f"{args.sentences} sentences per length, batch {args.batch_size} sequences, "
          f"best of {args.repeats}")
    print("| tokens | electric sent/s | mlm generator sent/s | mlm full sent/s "
          "| electric / mlm generator | electric / mlm full |")
    print("|---:|---:|---:|---:|---:|---:|")
    for length in args.lengths:
        rows = sentences(task, args.sentences, length, seed=length)
        speed = {name: sentences_per_s(s, rows, args.repeats) for name, s in scorers.items()}
        print(f"| {length} | {speed['electric']:.1f} | {speed['mlm generator']:.1f} "
              f"| {speed['mlm full']:.2f} | {speed['electric'] / speed['mlm generator']:.1f}x "
              f"| {speed['electric'] / speed['mlm full']:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
