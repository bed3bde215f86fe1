#!/usr/bin/env python
"""Time to the first compiled update (``--graphed-step``, or with ``--encoders`` the
encoders alone: ``--torch-compile``), cold, and where it goes.

Each row runs in a fresh process with an empty inductor cache (a fresh machine's first
update), through fairseq's Trainer on the plugin's model as fairseq-train builds it
(bench_pretrain.PluginStep), and reports the seconds of the first update, the second
update's seconds (the graph's pace), and dynamo's own split of the first: tracing the
step (dynamo), AOT autograd (the graph's functionalization, with inductor's graph passes),
inductor's lowering, its code generation, and the graphs compiled. A row ``+cache``
runs a fresh process on the inductor cache folder a cold row left (TORCHINDUCTOR_CACHE_DIR:
inductor's and AOT autograd's compiled graphs, and on a GPU the Triton kernels): what
carrying that folder to a machine with the same torch and device buys; ``cache_mb`` is the
folder's size.

    python benchmarks/compile_time.py --arch electra_small --backends inductor aot_eager
    python benchmarks/compile_time.py --arch electra_small --backends inductor --cache
    python benchmarks/compile_time.py --arch electra_small --backends aot_eager --encoders
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pretrain import PluginStep, electra_task, make_batches, write_dictionary  # noqa

# dynamo's timed functions (torch._dynamo.utils.compile_times) -> the phase they measure;
# each nests in the one before it
PHASES = {"dynamo": "_compile.compile_inner",
          "aot autograd": "create_aot_dispatcher_function",
          "inductor lowering": "GraphLowering.run",
          "code generation": "GraphLowering.compile_to_module"}


def phases() -> dict:
    """Seconds per phase, summed over the graphs compiled so far, each less the phases inside
    it: dynamo's own tracing, AOT autograd's (with inductor's graph passes), inductor's
    lowering and its code generation (on a CPU the C++ compiler, on a GPU Triton's)."""
    names, values = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
    seconds = dict(zip(names, (float(v) for v in values)))
    total = {phase: sum(s for name, s in seconds.items() if name.endswith(function))
             for phase, function in PHASES.items()}
    own = dict(total, dynamo=total["dynamo"] - total["aot autograd"],
               **{"aot autograd": total["aot autograd"] - total["inductor lowering"]
                  - total["code generation"]})
    return {phase: round(s, 1) for phase, s in own.items()}


def child(args) -> dict:
    """One row, in this (fresh) process."""
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        data = write_dictionary(Path(tmp), args.vocab)
        task = electra_task(data, args.arch, args.length)
        batches = [(s.to(device), t.to(device)) for s, t in
                   make_batches(task, 3, args.batch_size, args.length)]
        flags = ["--torch-compile", args.backend] + ([] if args.encoders else ["--graphed-step"])
        flags += ["--autocast-bf16"] if args.precision == "bf16" else []
        runner = PluginStep(data, args.arch, args.length, args.batch_size, device, flags,
                            extra=args.plugin_args)
        times = []
        for src, target in batches:
            start = time.perf_counter()
            runner.step(src, target)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    row = {"backend": args.backend, "first_update_s": round(times[0], 2),
           "next_update_s": round(min(times[1:]), 4), **phases(),
           "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
           "eager": bool(getattr(runner.model.electra_step, "fell_back", False))}
    return row


def run_row(args, backend, cache) -> dict:
    """One row in a fresh process whose inductor cache is the folder ``cache``."""
    with tempfile.NamedTemporaryFile() as out:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache,
                   OMP_NUM_THREADS=str(args.threads))
        argv = [args.python, __file__, "--child", out.name, "--backend", backend,
                *forwarded(args)]
        subprocess.run(argv, env=env, check=True)
        size = sum(f.stat().st_size for f in Path(cache).rglob("*") if f.is_file())
        return dict(json.loads(Path(out.name).read_text()), cache_mb=round(size / 2**20, 1))


def forwarded(args) -> list:
    return ["--arch", args.arch, "--length", str(args.length), "--batch-size",
            str(args.batch_size), "--vocab", str(args.vocab), "--device", args.device,
            "--precision", args.precision, "--threads", str(args.threads),
            *(["--encoders"] if args.encoders else []), "--plugin-args", *args.plugin_args]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="electra_small")
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--backends", nargs="+", default=["inductor", "aot_eager"])
    p.add_argument("--cache", action="store_true",
                   help="also time each backend once more on the cache its cold row left")
    p.add_argument("--encoders", action="store_true",
                   help="--torch-compile without --graphed-step: each encoder compiled alone")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--python", default=sys.executable,
                   help="the interpreter that runs each row (default: this one)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    p.add_argument("--plugin-args", nargs=argparse.REMAINDER, default=[],
                   help="more options for the plugin's model (last)")
    args = p.parse_args(argv)
    if args.child:
        import logging
        import warnings
        logging.disable(logging.WARNING)
        warnings.filterwarnings("ignore")
        Path(args.child).write_text(json.dumps(child(args)))
        return
    rows = []
    for backend in args.backends:
        with tempfile.TemporaryDirectory() as cache:  # empty: a fresh machine
            rows.append(dict(run_row(args, backend, cache), row=backend))
            if args.cache:
                rows.append(dict(run_row(args, backend, cache), row=f"{backend}+cache"))
    columns = ["row", "first_update_s", "next_update_s", *PHASES, "graphs", "eager",
               "cache_mb"]
    print(f"{'encoders' if args.encoders else 'graphed step'}, "
          f"{args.arch} {args.batch_size} x {args.length}, {args.precision}, {args.device}, "
          f"{args.threads} thread(s), torch {torch.__version__}")
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(str(row[c]) for c in columns))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
