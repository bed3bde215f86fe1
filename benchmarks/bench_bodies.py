#!/usr/bin/env python
"""The encoder bodies' training step: BERT's (the default), DeBERTa's and ModernBERT's, at the
same sizes, in one run on the same random batches, interleaved repeats.

Each row is fairseq's ``Trainer.train_step`` on the plugin (the harness of
``bench_pretrain.py``: ``PluginStep``, official hyperparameters, fp32) with
``--encoder-body``, on a **fixed-length** batch (every sequence T tokens) and a
**mixed-length** one (the same sequences cut to lengths drawn uniformly from T/4..T and
padded, where the modern body's unpadded layers skip the padding). It prints real tokens/s
(padding not counted), ms per update, the FLOPs the step executes (forward, backward and
optimizer, counted by ``torch.utils.flop_counter.FlopCounterMode`` on one step), achieved
FLOP/s, MFU against the matrix-multiply peak this run measures, and each body's tokens/s as
a ratio of the BERT body's in the same row group.

    python benchmarks/bench_bodies.py                      # CPU: small B16 and base B4, T=128
    python benchmarks/bench_bodies.py --sizes small --lengths 512 --batch-size 4
    python benchmarks/bench_bodies.py --device cuda --lengths 512 --batch-size 32

Results and the commands behind them: docs/benchmarks.md, "Encoder bodies".
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pretrain import (PluginStep, make_batches, matmul_peak, synchronize,  # noqa: E402
                            time_steps, write_dictionary)

ARCHS = {"small": "electra_small", "base": "electra_base"}


def mixed_lengths(batches, pad, seed=0):
    """The batches with sequence i cut to a length drawn from T/4..T (pads after it)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for src, target in batches:
        T = src.size(1)
        lengths = torch.randint(T // 4, T + 1, (len(src),), generator=g)
        padded = torch.arange(T)[None, :] >= lengths[:, None]
        out.append((src.masked_fill(padded, pad), target.masked_fill(padded, pad)))
    return out


def executed_flops(runner, batch):
    with FlopCounterMode(display=False) as counter:
        runner.step(*batch)
    return counter.get_total_flops()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["small", "base"], choices=list(ARCHS))
    p.add_argument("--bodies", nargs="+", default=["bert", "deberta", "modern"])
    p.add_argument("--lengths", nargs="+", type=int, default=[128])
    p.add_argument("--batch-size", type=int, default=None,
                   help="default: 16 for small, 4 for base")
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--steps", type=int, default=4, help="updates per timed repeat")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (median reported)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    peak = matmul_peak(device, "fp32")
    print(f"device {device}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"fp32 matmul peak {peak / 1e9:.1f} GFLOP/s")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = write_dictionary(Path(tmp), args.vocab)
        for size in args.sizes:
            batch_size = args.batch_size or (16 if size == "small" else 4)
            for length in args.lengths:
                runners = {body: PluginStep(data, ARCHS[size], length, batch_size, device,
                                            extra=["--encoder-body", body])
                           for body in args.bodies}
                task = next(iter(runners.values())).task
                fixed = make_batches(task, args.warmup + args.steps, batch_size, length)
                kinds = {"fixed": fixed,
                         "mixed": mixed_lengths(fixed, task.dictionary.pad())}
                for kind, batches in kinds.items():
                    batches = [(s.to(device), t.to(device)) for s, t in batches]
                    real = sum(int(s.ne(task.dictionary.pad()).sum()) for s, _ in
                               batches[args.warmup:]) / args.steps
                    times = {body: [] for body in runners}
                    flops = {}
                    for body, runner in runners.items():
                        for batch in batches[:args.warmup]:
                            runner.step(*batch)
                        flops[body] = executed_flops(runner, batches[0])
                    for _ in range(args.repeats):  # interleaved
                        for body, runner in runners.items():
                            times[body].append(time_steps(runner, batches[args.warmup:],
                                                          device))
                    for body in runners:
                        seconds = statistics.median(times[body])
                        rows.append(dict(size=size, length=length, batch=batch_size,
                                         kind=kind, body=body, tokens_per_s=real / seconds,
                                         ms=1000 * seconds, flops=flops[body],
                                         flops_per_s=flops[body] / seconds,
                                         mfu=flops[body] / seconds / peak))
                    bert = next((r for r in rows[-len(runners):] if r["body"] == "bert"), None)
                    for r in rows[-len(runners):]:
                        r["vs_bert"] = r["tokens_per_s"] / bert["tokens_per_s"] if bert else None
                del runners
                synchronize(device)
    print("| size | T | B | batch | body | tokens/s | ms/update | GFLOP/update | GFLOP/s | "
          "MFU | tokens/s vs bert |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']} | {r['length']} | {r['batch']} | {r['kind']} | {r['body']} | "
              f"{r['tokens_per_s']:,.0f} | {r['ms']:.0f} | {r['flops'] / 1e9:.1f} | "
              f"{r['flops_per_s'] / 1e9:.1f} | {100 * r['mfu']:.1f}% | "
              f"{r['vs_bert']:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps(dict(peak=peak, rows=rows), indent=1))


if __name__ == "__main__":
    main()
