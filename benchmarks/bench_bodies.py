#!/usr/bin/env python
"""The encoder bodies' training step: BERT's (the default), DeBERTa's and ModernBERT's, at the
same sizes, in one run on the same random batches, interleaved repeats.

Each row is fairseq's ``Trainer.train_step`` on the plugin (the harness of
``bench_pretrain.py``: ``PluginStep``, official hyperparameters, fp32 or with ``--precision
bf16`` the plugin's --autocast-bf16) with ``--encoder-body``, on a **fixed-length** batch (every sequence T tokens) and a
**mixed-length** one (the same sequences cut to lengths drawn uniformly from T/4..T and
padded, where the modern body's unpadded layers skip the padding). It prints real tokens/s
(padding not counted), ms per update, the FLOPs the step executes (forward, backward and
optimizer, counted by ``torch.utils.flop_counter.FlopCounterMode`` on one step), achieved
FLOP/s, MFU against the matrix-multiply peak this run measures, and each body's tokens/s as
a ratio of the BERT body's in the same row group.

Long context: ``--tokens N`` gives every length batches of N tokens (N / T sequences);
``modern-dense`` is the modern body with its local layers on the dense masked attention
(``ELECTRA_SPEED=-window``) instead of the window kernel (speed/window.py), ``modern-sdpa``
with its global layers on SDPA with the T x T padding mask (``ELECTRA_SPEED=-global``)
instead of speed/global_attention.py; ``--longest BODY=T`` leaves a body out above T; the
``saved MiB`` column is what the step keeps for its backward pass (weights included: the
bulk of a training step's peak memory, on any device), ``peak RSS MiB`` the process's peak
resident memory so far (one body and length per process for a row's own peak), ``CPU
ms`` the process's CPU time per update (with one thread, the step's time on a machine
that others share); ``--local-layer-exponent`` times one local layer forward and backward
at each length and fits the exponent of its time per sequence against T.

    python benchmarks/bench_bodies.py                      # CPU: small B16 and base B4, T=128
    python benchmarks/bench_bodies.py --sizes small --lengths 512 --batch-size 4
    python benchmarks/bench_bodies.py --device cuda --lengths 512 --batch-size 32
    python benchmarks/bench_bodies.py --sizes small --baseline REV   # before/after a change
    python benchmarks/bench_bodies.py --sizes small --tokens 8192 --kinds fixed \
        --lengths 512 1024 2048 4096 8192 --bodies modern modern-dense bert deberta \
        --longest bert=1024 deberta=1024 --no-flops --warmup 1 --steps 1 --repeats 1 \
        --release-cpu-memory --local-layer-exponent

Results and the commands behind them: docs/benchmarks.md, "Encoder bodies".
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pretrain import (PluginStep, make_batches, matmul_peak,  # noqa: E402
                            plugin_at_revision, synchronize, time_steps, write_dictionary)

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


DENSE = "-dense"  # a body name's suffix: its local layers on the dense masked attention
# a body name's suffix -> the speed part it turns off (ELECTRA_SPEED=-part)
PARTS_OFF = {DENSE: "-window", "-sdpa": "-global"}
AT = "@"  # a row's suffix: the plugin as of that git revision (--baseline)


def encoder_body(row: str) -> str:
    """The --encoder-body of a row name (``modern-dense@REV`` -> modern)."""
    name = row.split(AT)[0]
    return next((name.removesuffix(s) for s in PARTS_OFF if name.endswith(s)), name)


@contextmanager
def speed_setting(body):
    """ELECTRA_SPEED=-window for a ``modern-dense`` row, -global for a ``modern-sdpa`` one,
    the setting as it was otherwise."""
    before = os.environ.get("ELECTRA_SPEED")
    name = body.split(AT)[0]
    part = next((off for suffix, off in PARTS_OFF.items() if name.endswith(suffix)), None)
    if part:
        os.environ["ELECTRA_SPEED"] = part
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("ELECTRA_SPEED", None)
        else:
            os.environ["ELECTRA_SPEED"] = before


def saved_bytes(runner, batch):
    """Bytes the step keeps for its backward pass (each storage once)."""
    storages = {}

    def keep(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        runner.step(*batch)
    return sum(storages.values())


def exponent(lengths, seconds_per_sequence):
    """Least-squares slope of log(time per sequence) against log(T)."""
    x, y = [math.log(t) for t in lengths], [math.log(s) for s in seconds_per_sequence]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def local_layer_times(size, lengths, tokens, device, repeats=3):
    """{variant: seconds per sequence} of one local ModernBERT layer of ``size`` (forward and
    backward, 128-token window) on batches of ``tokens`` tokens at each length."""
    from omegaconf import OmegaConf

    from electra_plugin.models.bodies import body_named
    from electra_plugin.models.core.config import ARCH_SIZES, EncoderSize
    from electra_plugin.speed.unpad import Layout
    from electra_plugin.models.bodies.modern import rotary
    sizes = ARCH_SIZES[ARCHS[size]]
    hidden, heads = sizes["hidden_size"], sizes["num_heads"]
    cfg = OmegaConf.create(dict(embedding_size=hidden, dropout=0.0, attention_dropout=0.0,
                                global_attn_every_n_layers=2, local_attention=128,
                                global_rope_theta=160000.0, local_rope_theta=10000.0))
    body = body_named("modern")(cfg, 100, 1)
    layer = body.encoder(body.embeddings(), EncoderSize(
        2, hidden, heads, sizes["ffn_size"], hidden)).encoder.layer[1].to(device)
    out = {"modern": [], "modern" + DENSE: []}
    for length in lengths:
        batch = max(tokens // length, 1)
        x = torch.randn(batch, length, hidden, device=device, requires_grad=True)
        layout = Layout(None, batch, length, device)
        rope = rotary(layout.positions, hidden // heads, 10000.0)
        for variant in out:
            with speed_setting(variant):
                times = []
                for _ in range(repeats + 1):
                    synchronize(device)
                    start = time.perf_counter()
                    layer(x, layout, rope).sum().backward()
                    synchronize(device)
                    times.append(time.perf_counter() - start)
            out[variant].append(statistics.median(times[1:]) / batch)
    return out


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
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: the plugin's --autocast-bf16, MFU against the bf16 peak")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokens", type=int, default=None,
                   help="tokens per batch at every length (batch size N / T)")
    p.add_argument("--kinds", nargs="+", default=["fixed", "mixed"], choices=["fixed", "mixed"])
    p.add_argument("--longest", nargs="*", default=[], metavar="BODY=T",
                   help="leave BODY out at lengths above T")
    p.add_argument("--no-flops", action="store_true",
                   help="skip counting the executed FLOPs (one step less per row)")
    p.add_argument("--release-cpu-memory", action="store_true",
                   help="let glibc return each step's freed memory (several long-context "
                        "runners in one process would otherwise each hold their peak)")
    p.add_argument("--local-layer-exponent", action="store_true",
                   help="also time one local layer per length and fit its exponent")
    p.add_argument("--baseline", metavar="REV",
                   help="also time each body as of git revision REV (rows BODY@REV, "
                        "interleaved with this checkout's: before/after in one run)")
    p.add_argument("--json", type=Path, help="write the rows here")
    p.add_argument("--plugin-args", nargs=argparse.REMAINDER, default=[],
                   help="extra fairseq options for every row's model, last on the line "
                        "(e.g. --num-layers 2 --hidden-size 16: the rows at tiny widths)")
    args = p.parse_args(argv)
    longest = {body: int(t) for body, t in (item.split("=") for item in args.longest)}
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    peak = matmul_peak(device, args.precision, args.repeats)
    print(f"device {device}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{args.precision} matmul peak {peak / 1e9:.1f} GFLOP/s")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = write_dictionary(Path(tmp), args.vocab)
        baseline = plugin_at_revision(args.baseline, Path(tmp)) if args.baseline else None
        for size in args.sizes:
            for length in args.lengths:
                batch_size = args.tokens // length if args.tokens else \
                    args.batch_size or (16 if size == "small" else 4)
                positions = ["--max-positions", str(max(512, length))] + (
                    ["--release-cpu-memory"] if args.release_cpu_memory else []) + (
                    ["--autocast-bf16"] if args.precision == "bf16" else [])
                rows_here = [body + suffix for body in args.bodies for suffix in
                             ["", *([AT + args.baseline] if args.baseline else [])]
                             if length <= longest.get(body, length)]
                runners = {row: PluginStep(data, ARCHS[size], length, batch_size, device,
                                           extra=["--encoder-body", encoder_body(row),
                                                  *positions, *args.plugin_args],
                                           package=baseline if AT in row else None, name=row)
                           for row in rows_here}
                if not runners:  # every body left out at this length (--longest)
                    continue
                task = next(iter(runners.values())).task
                fixed = make_batches(task, args.warmup + args.steps, batch_size, length)
                kinds = {"fixed": fixed,
                         "mixed": mixed_lengths(fixed, task.dictionary.pad())}
                for kind in args.kinds:
                    batches = [(s.to(device), t.to(device)) for s, t in kinds[kind]]
                    real = sum(int(s.ne(task.dictionary.pad()).sum()) for s, _ in
                               batches[args.warmup:]) / args.steps
                    times = {body: [] for body in runners}
                    cpu = {body: [] for body in runners}
                    flops, saved = {}, {}
                    for body, runner in runners.items():
                        with speed_setting(body):
                            saved[body] = saved_bytes(runner, batches[0])
                            for batch in batches[1:args.warmup]:
                                runner.step(*batch)
                            flops[body] = None if args.no_flops else \
                                executed_flops(runner, batches[0])
                    for _ in range(args.repeats):  # interleaved
                        for body, runner in runners.items():
                            with speed_setting(body):
                                start = time.process_time()
                                times[body].append(time_steps(runner, batches[args.warmup:],
                                                              device))
                                cpu[body].append((time.process_time() - start) / args.steps)
                    for body in runners:
                        seconds = statistics.median(times[body])
                        rows.append(dict(size=size, length=length, batch=batch_size,
                                         kind=kind, body=body, tokens_per_s=real / seconds,
                                         ms=1000 * seconds, flops=flops[body],
                                         flops_per_s=flops[body] and flops[body] / seconds,
                                         mfu=flops[body] and flops[body] / seconds / peak,
                                         saved_mib=saved[body] / 2**20,
                                         cpu_ms=1000 * statistics.median(cpu[body]),
                                         peak_rss_mib=resource.getrusage(
                                             resource.RUSAGE_SELF).ru_maxrss / 1024))
                    bert = next((r for r in rows[-len(runners):] if r["body"] == "bert"), None)
                    for r in rows[-len(runners):]:
                        r["vs_bert"] = r["tokens_per_s"] / bert["tokens_per_s"] if bert else None
                del runners
                synchronize(device)
    print("| size | T | B | batch | body | tokens/s | ms/update | CPU ms | saved MiB | "
          "peak RSS MiB | GFLOP/update | GFLOP/s | MFU | tokens/s vs bert |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        counted = "| - | - | - |" if r["flops"] is None else (
            f"| {r['flops'] / 1e9:.1f} | {r['flops_per_s'] / 1e9:.1f} | {100 * r['mfu']:.1f}% |")
        vs_bert = "-" if r["vs_bert"] is None else f"{r['vs_bert']:.2f}x"
        print(f"| {r['size']} | {r['length']} | {r['batch']} | {r['kind']} | {r['body']} | "
              f"{r['tokens_per_s']:,.0f} | {r['ms']:.0f} | {r['cpu_ms']:.0f} | "
              f"{r['saved_mib']:,.0f} | {r['peak_rss_mib']:,.0f} {counted} "
              f"{vs_bert} |")
    layer = None
    if args.local_layer_exponent:
        tokens = args.tokens or max(args.lengths)
        layer = local_layer_times(args.sizes[0], args.lengths, tokens, device)
        print(f"\none local layer ({args.sizes[0]}, 128-token window), forward + backward, "
              f"ms per sequence at {tokens:,} tokens per batch:")
        print("| variant | " + " | ".join(f"T={t}" for t in args.lengths) + " | exponent |")
        print("|---|" + "---|" * (len(args.lengths) + 1))
        for variant, seconds in layer.items():
            print(f"| {variant} | " + " | ".join(f"{1000 * s:.1f}" for s in seconds) +
                  f" | {exponent(args.lengths, seconds):.2f} |")
    if args.json:
        args.json.write_text(json.dumps(dict(peak=peak, rows=rows, local_layer=layer),
                                        indent=1))


if __name__ == "__main__":
    main()
