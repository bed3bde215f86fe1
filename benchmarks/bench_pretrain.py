#!/usr/bin/env python
"""Training-step benchmark: the plugin's ELECTRA step next to a transformers peer.

One command, the same random batches for all, interleaved repeats; each implementation runs
in a worker process of its own (its heap and malloc setting are its users', untouched by
the other rows). For each model size,
sequence length and precision it prints tokens/s, ms per update, peak memory, achieved
FLOP/s and MFU (against the matrix-multiply peak this run measures) for

- ``plugin <flags>``: fairseq's own ``Trainer.train_step`` (what ``fairseq-train`` runs per
  update) on the plugin's ``ElectraModel``, ``electra`` criterion and ``electra_adam``
  optimizer, with the official hyperparameters (clip-norm 1, weight decay 0.01, polynomial
  lr), set up from the command line a user types for the precision: ``fp32`` (no flag),
  ``--autocast-bf16`` and ``--bf16`` (electra-train), ``--amp`` and ``--fp16``;
- ``peer``: transformers' ``ElectraForMaskedLM`` (generator) and ``ElectraForPreTraining``
  (discriminator) of the same sizes sharing one embedding module, full-vocabulary generator
  logits, Gumbel sampling, ``loss = gen + 50 * disc``, ``torch.optim.AdamW`` and
  ``clip_grad_norm_(1.0)`` (``pip install -e '.[hf]'``), with glibc's own malloc behaviour,
  under torch.autocast in bf16 / fp16 (with a GradScaler) for those precisions;
- ``peer-retained`` (CPU): the same peer given the plugin's allocator setting (freed memory
  kept in the process), so that the step's speed and the allocator's show separately;

- ``data``: masked sequences/s of one fairseq loader worker on one core (items and the
  electra task's collater, which masks, on a binarized corpus: ``--data-dir`` or random
  blocks), with the task's masking and with ``--whole-word-mask`` (and as of ``--baseline``);

and the ratios plugin/peer and plugin/peer-retained per row, whether the CPU has bf16
matrix units, and an advice line when the plugin's bf16 rows are slower than its fp32 row.
FLOPs per update are given the way the paper counts them (``electra_plugin.models.core.flops.paper_train_flops``, comparable with the
paper's train-FLOPs column) and as executed (matmuls only, ``executed_train_flops``, the
basis of MFU).

    python benchmarks/bench_pretrain.py                       # CPU: small, fp32 and bf16
    python benchmarks/bench_pretrain.py --models electra_base --batch-size 8 --precisions bf16
    python benchmarks/bench_pretrain.py --fairseq-train       # also time fairseq-train itself
    python benchmarks/bench_pretrain.py --clip --threads 2    # only the gradient clipping
    python benchmarks/bench_pretrain.py --data-only --baseline e99c820   # the loader only
    python benchmarks/bench_pretrain.py --count --baseline 49d7eaa --threads 1  # host work

See docs/benchmarks.md for results and what limits the speed.
"""

import argparse
import contextlib
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from electra_plugin.data.masking import max_predictions, prediction_slots
from electra_plugin.speed import retain_freed_memory
from electra_plugin.speed.launch import PRELOADED
from electra_plugin.speed.switch import PARTS
from electra_plugin.models.core.flops import executed_train_flops, paper_train_flops
from electra_plugin.models.generators import model_sizes

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "electra_plugin"

OFFICIAL_LENGTH = {"electra_tiny": 128, "electra_small": 128, "electra_base": 512,
                   "electra_large": 512}
DISC_WEIGHT = 50.0
# Official pre-training hyperparameters (examples/pretraining/config: electra_small).
LR, BETAS, EPS, WEIGHT_DECAY, CLIP_NORM = 5e-4, (0.9, 0.999), 1e-6, 0.01, 1.0


# ------------------------------------------------------------------------------ data


def write_dictionary(directory: Path, vocab: int) -> Path:
    """A dict.txt that, with the task's <mask>, gives ``vocab`` entries (like BERT's 30522);
    every fifth symbol is a WordPiece continuation (``##``), so that random text has words
    of 1.25 pieces on average for whole-word masking."""
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(vocab - len(d) - 1):
        d.add_symbol(f"##w{i}" if i % 5 == 4 else f"w{i}", n=vocab - i)
    directory.mkdir(parents=True, exist_ok=True)
    d.save(str(directory / "dict.txt"))
    return directory


def electra_task(data_dir, arch, length, extra=()):
    """The plugin's electra task on ``data_dir`` (its dict.txt), as fairseq-train sets it up
    (``extra``: more task options)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = [str(data_dir), "--user-dir", str(PLUGIN), "--task", "electra", "--arch", arch,
            "--criterion", "electra", "--tokens-per-sample", str(length), *extra]
    return tasks.setup_task(convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_training_parser(), argv)).task)


def make_batches(task, count, batch_size, length, mask_prob=0.15, leave_unmasked=0.15, seed=0):
    """Random full blocks (<s> first), masked as the electra task does: (src, target) pairs."""
    d = task.dictionary
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        tokens = torch.randint(d.nspecial, task.mask_idx, (batch_size, length), generator=g)
        tokens[:, 0] = d.bos()
        picked = torch.rand(batch_size, length, generator=g) < mask_prob
        picked[:, 0] = False
        keep = picked & (torch.rand(batch_size, length, generator=g) < leave_unmasked)
        src = tokens.masked_fill(picked & ~keep, task.mask_idx)
        target = tokens.masked_fill(~picked, d.pad())
        batches.append((src, target))
    return batches


def write_binarized(directory: Path, task, sequences: int, length: int, seed: int = 0):
    """A train split of random tokens for fairseq-train (one 'sentence' per block)."""
    from fairseq.data import indexed_dataset

    g = torch.Generator().manual_seed(seed)
    d = task.dictionary
    builder = indexed_dataset.make_builder(str(directory / "train.bin"), impl="mmap",
                                           vocab_size=len(d))
    for _ in range(sequences):
        builder.add_item(torch.randint(d.nspecial, task.mask_idx, (length - 1,), generator=g))
    builder.finalize(str(directory / "train.idx"))


# ------------------------------------------------------------------------------ steps


def autocast(device, precision):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


# The plugin's rows per precision: (name, flags) as a user types them on electra-train's
# (= fairseq-train's) command line; the first of each is the one the README recommends.
# --amp is fairseq's fp16 autocast with a loss scaler (CUDA autocast: on CPU it computes
# in fp32); fairseq's flat fp32 master copy needs CUDA, hence --fp16-no-flatten-grads on CPU.
PLUGIN_MODES = {
    "fp32": [("fp32", [])],
    "bf16": [("--autocast-bf16", ["--autocast-bf16"]), ("--bf16 (electra-train)", ["--bf16"])],
    "fp16": [("--amp", ["--amp"]), ("--fp16", ["--fp16"])],
}


def plugin_modes(precision, device):
    return [(name, flags + (["--fp16-no-flatten-grads"] if "--fp16" in flags
                            and device.type == "cpu" else []))
            for name, flags in PLUGIN_MODES[precision]]


class PluginStep:
    """fairseq's Trainer.train_step on the plugin's model, criterion and optimizer, set up
    from the command line electra-train (fairseq-train with --bf16 usable) would parse.

    ``flags``: the precision flags of the row (:data:`PLUGIN_MODES`); ``package``: the
    plugin package whose model and criterion to use (default: this checkout's;
    :func:`plugin_at_revision` gives an older one for before/after timings).
    """

    def __init__(self, data_dir, arch, length, batch_size, device, flags=(), extra=(),
                 package=None, name="plugin"):
        from fairseq import tasks, utils
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf
        from fairseq.logging import metrics
        from fairseq.trainer import Trainer

        from electra_plugin.cli.train import parse_args

        argv = [str(data_dir), "--user-dir", str(PLUGIN), "--task", "electra",
                "--criterion", "electra", "--arch", arch, "--tokens-per-sample", str(length),
                "--batch-size", str(batch_size), "--optimizer", "electra_adam",
                "--adam-betas", str(BETAS), "--adam-eps", str(EPS),
                "--weight-decay", str(WEIGHT_DECAY), "--clip-norm", str(CLIP_NORM),
                "--lr", str(LR), "--lr-scheduler", "polynomial_decay",
                "--warmup-updates", "10000", "--total-num-update", "1000000", "--seed", "1",
                *flags, *extra] + (["--cpu"] if device.type == "cpu" else [])
        cfg = convert_namespace_to_omegaconf(parse_args(argv))
        utils.import_user_module(cfg.common)
        metrics.reset()
        self.task = tasks.setup_task(cfg.task)
        torch.manual_seed(1)
        if package is None:
            model = self.task.build_model(cfg.model)
            criterion = self.task.build_criterion(cfg.criterion)
        else:
            model_cls = package.models.electra.ElectraModel
            model = model_cls(package.models.electra.complete_config(cfg.model),
                              self.task.source_dictionary, pretraining=True)
            criterion = package.criterions.electra.ElectraCriterion(
                self.task, cfg.criterion.disc_weight)
        self.trainer = Trainer(cfg, self.task, model, criterion)
        self.package, self.slots = package, {}
        self.model, self.name, self.device = self.trainer.model, name, device
        # the electra task keeps freed CPU memory unless told not to (allocator.py)
        self.retains_memory = "--release-cpu-memory" not in extra

    def step(self, src, target):
        self.trainer.train_step([self.sample(src, target)])

    def sample(self, src, target):
        """The batch as the electra task's collater gives it: with this checkout, each row's
        prediction slots and their weights and the host's count of picked positions (made
        once per batch, before any timed update); an older revision gets the plain layout."""
        sample = {"id": torch.arange(len(src)),
                  "net_input": {"src_tokens": src, "src_lengths": torch.full(
                      (len(src),), src.size(1), device=src.device)},
                  "target": target, "ntokens": src.numel(), "nsentences": len(src)}
        if self.package is not None:
            return sample
        key = (target.data_ptr(), target.shape)
        if key not in self.slots:
            picked = target.ne(self.task.dictionary.pad())
            positions, weights = prediction_slots(
                picked.cpu(), max_predictions(self.task.cfg.mask_prob, src.size(1)))
            self.slots[key] = (positions.to(src.device), weights.to(src.device),
                               int(picked.sum()))
        positions, weights, picked = self.slots[key]
        sample["net_input"].update(masked_positions=positions, masked_weights=weights,
                                   has_padding=False)
        sample["nmasked"] = picked
        return sample

    def forward_context(self):
        """The autocast the trainer's step runs the forward under (for --breakdown's parts):
        the task's bf16 with --autocast-bf16, fairseq's CUDA fp16 with --amp."""
        from fairseq.optim.amp_optimizer import AMPOptimizer

        if isinstance(self.trainer.optimizer, AMPOptimizer) and self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.float16)
        return self.task.autocast(self.model)

    def parameters(self):
        """The model's parameters and the optimizer's (the fp32 master copies of --bf16 and
        --fp16)."""
        groups = self.trainer.optimizer.optimizer.param_groups
        return [*self.model.parameters(), *(p for g in groups for p in g["params"])]

    def optimizer_state(self):
        return self.trainer.optimizer.optimizer.state


def plugin_at_revision(rev, directory: Path):
    """The ``electra_plugin`` package as of git revision ``rev``, imported under another name.

    Its model and criterion classes run next to this checkout's in the same process; its
    fairseq registrations are skipped (the names are taken by this checkout's classes).
    """
    import importlib
    import io
    import tarfile

    import fairseq.criterions
    import fairseq.models
    import fairseq.optim
    import fairseq.tasks

    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "electra_plugin"],
                             check=True, capture_output=True).stdout
    name = "electra_plugin_" + re.sub(r"\W", "_", rev)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(directory / "ref", filter="data")
    (directory / "ref" / "electra_plugin").rename(directory / "ref" / name)
    sys.path.insert(0, str(directory / "ref"))
    skip = lambda *args, **kwargs: (lambda cls: cls)  # noqa: E731
    names = [(m, f) for m, fs in ((fairseq.models, ("register_model",
                                                    "register_model_architecture")),
                                  (fairseq.criterions, ("register_criterion",)),
                                  (fairseq.tasks, ("register_task",)),
                                  (fairseq.optim, ("register_optimizer",))) for f in fs]
    saved = [getattr(m, f) for m, f in names]
    try:
        for m, f in names:
            setattr(m, f, skip)
        package = importlib.import_module(name)
        importlib.import_module(name + ".models.electra")
        importlib.import_module(name + ".criterions.electra")
    finally:
        for (m, f), fn in zip(names, saved):
            setattr(m, f, fn)
    return package


class PeerStep:
    """The same step written with transformers, as a user of its ELECTRA classes would.

    ``retains_memory``: on CPU, run it with the plugin's malloc setting instead of glibc's
    own (the ``peer-retained`` row: the same allocator for both, to separate the step's
    speed from the allocator's).
    """

    def __init__(self, cfg, vocab, pad, device, precision, retains_memory=False):
        from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

        disc, gen = model_sizes(cfg)

        def config(size):
            return ElectraConfig(
                vocab_size=vocab, embedding_size=size.embedding, hidden_size=size.hidden,
                num_hidden_layers=size.layers, num_attention_heads=size.heads,
                intermediate_size=size.ffn, max_position_embeddings=cfg.max_positions,
                type_vocab_size=cfg.type_vocab_size, hidden_dropout_prob=cfg.dropout,
                attention_probs_dropout_prob=cfg.attention_dropout, pad_token_id=pad)

        torch.manual_seed(1)
        self.generator = ElectraForMaskedLM(config(gen)).to(device)
        self.discriminator = ElectraForPreTraining(config(disc)).to(device)
        # share the embedding block; keep the generator's output layer tied to it
        self.generator.electra.embeddings = self.discriminator.electra.embeddings
        self.generator.generator_lm_head.weight = \
            self.discriminator.electra.embeddings.word_embeddings.weight
        self.params = list({id(p): p for m in (self.generator, self.discriminator)
                            for p in m.parameters()}.values())
        self.optimizer = torch.optim.AdamW(self.params, lr=LR, betas=BETAS, eps=EPS,
                                           weight_decay=WEIGHT_DECAY)
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        self.pad, self.device, self.precision = pad, device, precision
        self.retains_memory = retains_memory
        self.name = "peer-retained" if retains_memory else "peer"

    def step(self, src, target):
        src, target = src.to(self.device), target.to(self.device)
        self.generator.train()
        self.discriminator.train()
        masked = target.ne(self.pad)
        with autocast(self.device, self.precision):
            gen_logits = self.generator(input_ids=src).logits  # B x T x V
            masked_logits = gen_logits[masked].float()
            gen_loss = F.cross_entropy(masked_logits, target[masked])
            with torch.no_grad():
                u = torch.rand_like(masked_logits)
                sampled = (masked_logits - torch.log(-torch.log(u + 1e-9) + 1e-9)).argmax(-1)
            corrupted = src.masked_scatter(masked, sampled)
            labels = corrupted.ne(torch.where(masked, target, src)).float()
            disc_logits = self.discriminator(input_ids=corrupted).logits
            real = src.ne(self.pad)
            disc_loss = F.binary_cross_entropy_with_logits(disc_logits[real].float(),
                                                           labels[real])
            loss = gen_loss + DISC_WEIGHT * disc_loss
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, CLIP_NORM)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def parameters(self):
        return self.params

    def optimizer_state(self):
        return self.optimizer.state


# ------------------------------------------------------------------------------ measuring


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def product_seconds(a, b, device, inner):
    """Seconds per ``a @ b``, the mean of ``inner`` back to back."""
    synchronize(device)
    t = time.perf_counter()
    for _ in range(inner):
        a @ b
    synchronize(device)
    return (time.perf_counter() - t) / inner


def matmul_peak(device, precision, repeats):
    """Best measured FLOP/s of plain matrix multiplications shaped like the model's, each
    shape's the median of ``repeats`` (the rows' --repeats: one knob for how long a run
    measures)."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    shapes = [(2048, 256, 1024), (2048, 1024, 256), (2048, 768, 3072), (4096, 1024, 1024)]
    if device.type == "cuda":
        shapes = [(8192, 8192, 8192), (16384, 3072, 768), (16384, 768, 3072)]
    best, deadline = 0.0, time.perf_counter() + 10
    for m, k, n in shapes:
        flops = 2 * m * k * n
        if best and time.perf_counter() + 4 * flops / best > deadline:
            # its four products at the rate so far would overrun (a dtype without hardware
            # support: a minute at bf16 on such a CPU): the shapes timed so far must do
            break
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        a @ b
        single = product_seconds(a, b, device, 1)
        # ~0.2 s per repeat; a product that takes longer is a repeat of its own, two at most
        # (bf16 runs at 0.7 to 3 GFLOP/s on CPUs without bf16 units, docs/benchmarks.md)
        if single < 0.2:
            inner = int(0.2 / max(single, 1e-6))
            times = [product_seconds(a, b, device, inner) for _ in range(repeats)]
        else:
            times = [single] + [product_seconds(a, b, device, 1)
                                for _ in range(min(repeats, 2) - 1)]
        best = max(best, flops / statistics.median(times))
    return best


def peak_memory(runner, batch, device):
    """Peak bytes of live tensors during one step (after warm-up, optimizer state exists).

    CUDA: ``torch.cuda.max_memory_allocated``. CPU: the tensors alive at the start of the
    step (parameters, gradients, optimizer state) plus the largest running total of the
    step's allocations minus frees, from torch.profiler's memory events.
    """
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        runner.step(*batch)
        synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    resident = {}
    for p in runner.parameters():
        for t in (p, p.grad):
            if t is not None:
                resident[t.data_ptr()] = t.untyped_storage().nbytes()
    for state in runner.optimizer_state().values():
        for t in state.values():
            if torch.is_tensor(t) and t.numel() > 1:
                resident[t.data_ptr()] = t.untyped_storage().nbytes()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        runner.step(*batch)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    live = top = 0
    for _, nbytes in events:
        live += nbytes
        top = max(top, live)
    return sum(resident.values()) + top


def page_faults():
    """Minor page faults of this process so far (fresh pages the kernel had to map)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def profile_steps(runner, batches, device, top=12):
    """One more pass over ``batches`` under torch.profiler -> (the device's busy ms per update:
    the sum of its kernels' times, 0 on a CPU; the ``top`` operators by host time, each
    [name, calls, self host ms, self device ms] per update). Busy time well under the wall
    time means the device waits on the host."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    with profile(activities=activities) as prof:
        time_steps(runner, batches, device)
    n = len(batches)
    events = prof.key_averages()
    # a kernel is device time with no host time of its own; an operator's self device time
    # is the kernels it launched, so sum the kernels only (each counted once)
    busy = sum(e.self_device_time_total for e in events
               if e.self_device_time_total and not e.self_cpu_time_total) / 1e3 / n
    ops = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    return busy, [[e.key, e.count / n, e.self_cpu_time_total / 1e3 / n,
                   e.self_device_time_total / 1e3 / n] for e in ops]


def time_steps(runner, batches, device):
    synchronize(device)
    start = time.perf_counter()
    for src, target in batches:
        runner.step(src, target)
    synchronize(device)
    return (time.perf_counter() - start) / len(batches)


class Row(NamedTuple):
    """One row of a configuration: its ``--impls`` name, row name, plugin flags and the
    ``ELECTRA_SPEED`` its worker runs under (None: this process's)."""

    impl: str
    name: str
    flags: list
    speed: Optional[str] = None


def row_specs(impls, precision, device, baseline, compile_backend=None, graphed=False,
              graphed_speeds=()):
    """The :class:`Row` s of one precision: "plugin" gives one row per command line of
    :data:`PLUGIN_MODES` (and the first again with ``--torch-compile`` when
    ``compile_backend`` is set, and with ``--graphed-step`` when ``graphed``: True or its
    own backend, once more under each of ``graphed_speeds``), "baseline" the first at REV."""
    rows = []
    for impl in impls:
        if impl == "plugin":
            rows += [Row(impl, f"plugin {name}", flags)
                     for name, flags in plugin_modes(precision, device)]
            name, flags = plugin_modes(precision, device)[0]
            if compile_backend:
                rows.append(Row(impl, f"plugin {name} --torch-compile {compile_backend}",
                                flags + ["--torch-compile", compile_backend]))
            if graphed:
                backend = graphed if isinstance(graphed, str) else compile_backend
                flags = flags + ["--graphed-step"] + (["--torch-compile", backend]
                                                      if backend else [])
                rows.append(Row(impl, f"plugin {name} --graphed-step", flags))
                rows += [Row(impl, f"plugin {name} --graphed-step ELECTRA_SPEED={speed}",
                             flags, speed) for speed in graphed_speeds]
        elif impl == "baseline":
            rows.append(Row(impl, f"plugin@{baseline}", plugin_modes(precision, device)[0][1]))
        else:
            rows.append(Row(impl, impl, []))
    return rows


def build_runner(spec, args, c):
    """The step of one row of :func:`row_specs`, built where it will run; ``c``: the
    configuration run_config shares with its workers."""
    impl, name, flags, _ = spec
    if impl in ("plugin", "baseline"):
        package = plugin_at_revision(args.baseline, c.ref_dir) if impl == "baseline" else None
        return PluginStep(c.data_dir, c.arch, c.length, args.batch_size, c.device, flags,
                          extra=args.plugin_args, package=package, name=name)
    return PeerStep(arch_config(c.arch, args.plugin_args), c.vocab, c.pad, c.device, c.precision,
                    retains_memory=impl == "peer-retained")


def arch_config(arch, options=()):
    """The plugin's model config of ``arch`` (sizes, dropout, positions), with the model's
    own ``--option VALUE`` pairs of ``options`` (``--plugin-args``: the plugin's rows get
    them, so the peer and the FLOPs take them too; the others are fairseq's to read)."""
    from omegaconf import OmegaConf

    from electra_plugin.models.core.config import ElectraConfig, complete_config

    fields = ElectraConfig.__dataclass_fields__
    given = {key[2:].replace("-", "_"): value for key, value in zip(options, options[1:])
             if key.startswith("--") and key[2:].replace("-", "_") in fields}
    return complete_config(OmegaConf.create({"_name": arch, **given}))


def quiet():
    import logging

    logging.disable(logging.WARNING)  # fairseq's model/trainer summaries
    warnings.filterwarnings("ignore")  # hydra's deprecation notes on every config build


def serve(conn, spec, args, config, batches, threads):
    """Worker process: build one implementation, then run what the parent asks for."""
    quiet()
    torch.set_num_threads(threads)
    if spec.speed is not None:
        os.environ["ELECTRA_SPEED"] = spec.speed
    device = config.device
    batches = [(src.to(device), target.to(device)) for src, target in batches]
    try:
        runner = build_runner(spec, args, config)
        if device.type == "cpu" and runner.retains_memory:
            retain_freed_memory()  # what the electra task does on its first update
        conn.send((True, runner.name))
    except Exception as e:  # noqa: BLE001 (reported by the parent)
        conn.send((False, repr(e)))
        return
    while True:
        request = conn.recv()
        if request == "exit":
            return
        try:
            if request == "warmup":
                for src, target in batches[:args.warmup]:
                    runner.step(src, target)
                result = None
            elif request == "time":
                cpu, minflt = time.process_time(), page_faults()
                seconds = time_steps(runner, batches, device)
                result = (seconds, (time.process_time() - cpu) / len(batches),
                          (page_faults() - minflt) / len(batches))
            elif request == "profile":
                result = profile_steps(runner, batches, device)
            else:  # "memory"
                result = peak_memory(runner, batches[0], device)
            conn.send((True, result))
        except Exception as e:  # noqa: BLE001
            conn.send((False, repr(e)))


class Worker:
    """One implementation in a process of its own, as its users run it: its own heap,
    malloc setting and warm state, which none of the other rows can disturb (glibc's
    thresholds and heap layout depend on everything a process allocated before)."""

    def __init__(self, spec, args, config, batches):
        import multiprocessing

        # forked by the stdlib's fork server, which has imported torch and fairseq once (a
        # fresh process each, without a row's seconds of imports): the list the plugin's trials
        # preload (speed/launch.py), so that a process forked from a server that runs one
        # (the tests') shares it; a peer's worker imports transformers itself (1.3 s)
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOADED)
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=serve, daemon=True, args=(
            child, spec, args, config, batches, torch.get_num_threads()))
        self.process.start()
        self.name = self._reply(spec[1])

    def _reply(self, what):
        ok, value = self.conn.recv()
        if not ok:
            raise RuntimeError(f"benchmark worker {what}: {value}")
        return value

    def __call__(self, request):
        self.conn.send(request)
        return self._reply(f"{self.name} {request}")

    def close(self):
        self.conn.send("exit")
        self.process.join()


def run_config(args, arch, length, precision, device, data_root):
    """Every implementation on the same batches, timed in interleaved repeats -> result rows."""
    batch_size = args.batch_size
    tag = f"{arch} T={length} B={batch_size} {precision}"
    data_dir = write_dictionary(data_root / f"dict{args.vocab}", args.vocab)
    task = electra_task(data_dir, arch, length)
    vocab, pad = len(task.dictionary), task.dictionary.pad()
    cfg = arch_config(arch, args.plugin_args)
    batches = make_batches(task, args.steps, batch_size, length, seed=0)  # moved by workers
    config = SimpleNamespace(arch=arch, length=length, precision=precision, device=device,
                             data_dir=data_dir, ref_dir=Path(tempfile.mkdtemp(dir=data_root)),
                             vocab=vocab, pad=pad)
    specs = row_specs(args.impls, precision, device, args.baseline, args.compile, args.graphed,
                      args.graphed_speed)
    flags = {spec.name: spec.flags for spec in specs}
    workers = [Worker(spec, args, config, batches) for spec in specs]
    times = {w.name: [] for w in workers}
    cpu_times = {w.name: [] for w in workers}
    faults = {w.name: [] for w in workers}

    def timed(worker):
        seconds, cpu, minflt = worker("time")
        times[worker.name].append(seconds)
        cpu_times[worker.name].append(cpu)
        faults[worker.name].append(minflt)
        return seconds

    try:
        # warm-up (optimizer state, cuBLAS choices, heap, compiling), then a first repeat,
        # printed at once, compiled rows last: a run cut by a time limit still has the others
        for worker in sorted(workers, key=lambda w: "--graphed-step" in flags[w.name]
                             or "--torch-compile" in flags[w.name]):
            worker("warmup")
            seconds = timed(worker)
            print(f"{tag} {worker.name}: {1e3 * seconds:.1f} ms/update, "
                  f"{batch_size * length / seconds:.0f} tokens/s (first repeat)", flush=True)
        for _ in range(args.repeats - 1):  # interleaved, so that all see the same machine load
            for worker in workers:
                timed(worker)
        memory = {w.name: w("memory") for w in workers}
        profiled = {}
        for worker in workers if args.profile else []:
            try:  # the timed rows stand without it
                profiled[worker.name] = worker("profile")
            except RuntimeError as error:
                print(f"{tag} {worker.name}: not profiled ({error})", flush=True)
    finally:
        for worker in workers:
            worker.close()

    disc, gen = model_sizes(cfg)
    masked = sum(int(t.ne(pad).sum()) for _, t in batches) / len(batches)
    paper = paper_train_flops(disc, gen, vocab, length, batch_size, predicted=masked)
    rows = []
    for name in times:
        seconds = statistics.median(times[name])
        executed = executed_train_flops(disc, gen, vocab, length, batch_size, masked,
                                        full_vocab_generator=name.startswith("peer"))
        rows.append(dict(
            config=tag, arch=arch, length=length, batch_size=batch_size,
            precision=precision, impl=name, flags=flags[name], ms_per_update=1e3 * seconds,
            ms_per_update_repeats=[1e3 * t for t in times[name]],
            cpu_ms_per_update=1e3 * statistics.median(cpu_times[name]),
            page_faults_per_update=statistics.median(faults[name]),
            tokens_per_s=batch_size * length / seconds, peak_memory_bytes=memory[name],
            paper_flops_per_update=paper, executed_flops_per_update=executed,
            achieved_flops_per_s=executed / seconds))
        if name in profiled:
            rows[-1].update(device_busy_ms_per_update=profiled[name][0],
                            top_host_ops=profiled[name][1])
    recommended = f"plugin {plugin_modes(precision, device)[0][0]}"
    for row in rows:
        # median of the per-repeat ratios: each pair ran back to back under the same load
        for other, key in (("peer", "vs_peer"), ("peer-retained", "vs_peer_retained"),
                           (f"plugin@{args.baseline}", "vs_baseline")):
            if other in times and row["impl"].startswith("plugin") and row["impl"] != other \
                    and (key != "vs_baseline" or row["impl"] == recommended):
                row[key] = statistics.median(
                    b / a for a, b in zip(times[row["impl"]], times[other]))
                row["memory_" + key] = memory[row["impl"]] / memory[other]
    return rows


# ------------------------------------------------------------------------------ breakdown


# part of the breakdown: the profiler labels it sums (the step's own, electra:*, and fairseq's
# FairseqTask.train_step and Trainer.train_step ones)
BREAKDOWN_LABELS = {
    "generator": ("electra:generator",), "sampling": ("electra:sample",),
    "discriminator": ("electra:discriminator",), "losses": ("electra:losses",),
    "forward": ("forward",), "backward": ("backward",),
    "optimizer": ("multiply-grads", "clip-grads", "optimizer"), "step": ("bench:step",)}


def breakdown(args, arch, length, precision, device, data_root, repeats):
    """Median ms of each part of the plugin's real update (``Trainer.train_step``), read from
    the profiler labels the step runs under.

    generator, sampling, discriminator, losses: the forward parts of ``electra_step``
    (generator encoder and head at the masked positions; the sample and the corrupted input;
    discriminator encoder and head; both losses and the logged counts); forward: all of the
    criterion's forward; backward: the whole backward pass (both networks); optimizer:
    fairseq's gradient scaling, clipping and the optimizer step; step: the whole
    ``Trainer.train_step``, whose rest is fairseq's bookkeeping; data: masking and collating
    one batch from binarized blocks (the electra task's dataset, as fairseq-train's loader
    runs it), not in the step. On CUDA each part is the GPU time of its kernels.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    data_dir = write_dictionary(data_root / f"dict{args.vocab}", args.vocab)
    runner = PluginStep(data_dir, arch, length, args.batch_size, device,
                        plugin_modes(precision, device)[0][1], extra=args.plugin_args)
    batches = make_batches(runner.task, repeats + 1, args.batch_size, length, seed=1)
    activities = [ProfilerActivity.CPU] + \
        ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    parts = {k: [] for k in BREAKDOWN_LABELS}
    for src, target in batches:
        src, target = src.to(device), target.to(device)
        with profile(activities=activities) as prof:
            with record_function("bench:step"):
                runner.step(src, target)
            synchronize(device)
        ms = {e.key: (e.device_time_total if device.type == "cuda" else e.cpu_time_total) / 1e3
              for e in prof.key_averages()}
        for part, labels in BREAKDOWN_LABELS.items():
            parts[part].append(sum(ms.get(label, 0.0) for label in labels))
    result = {k: statistics.median(v[1:]) for k, v in parts.items()}  # first: warm-up
    task = electra_task(data_corpus(args, arch, length, data_root, args.batch_size, repeats),
                        arch, length)
    task.load_dataset("train")
    result["data"] = statistics.median(loader_seconds(task, args.batch_size, repeats)[0]) * 1e3
    return result


def clip_ms(args, arch, device, data_root, repeats=20, calls=10):
    """Median ms of fairseq's gradient scaling (``multiply_grads``) and clipping
    (``clip_grad_norm``, --clip-norm 1) as the trainer runs them each update, over ``arch``'s
    parameters with random gradients, with ``ELECTRA_SPEED`` on (one ``_foreach_norm``; the
    scaling is then left to the next Adam step, not timed here) and off (fairseq's per-tensor
    norms and its scaling), interleaved: {switch value: {part: ms}}."""
    from electra_plugin.speed.switch import VARIABLE

    data_dir = write_dictionary(data_root / f"dict{args.vocab}", args.vocab)
    trainer = PluginStep(data_dir, arch, 128, args.batch_size, device,
                         extra=args.plugin_args).trainer
    params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    for p in params:
        p.grad = torch.randn_like(p)
    parts = {"multiply_grads": lambda: trainer.optimizer.multiply_grads(1.0),
             "clip_grad_norm": lambda: trainer.clip_grad_norm(CLIP_NORM)}
    times = {switch: {part: [] for part in parts} for switch in ("1", "0")}
    for _ in range(repeats + 1):
        for switch, by_part in times.items():
            os.environ[VARIABLE] = switch
            for part, fn in parts.items():
                synchronize(device)
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                synchronize(device)
                by_part[part].append(1e3 * (time.perf_counter() - start) / calls)
    del os.environ[VARIABLE]
    print(f"{arch}: {len(params)} parameter tensors, {sum(p.numel() for p in params):,} "
          f"values, {device}, {torch.get_num_threads()} threads")
    result = {switch: {part: statistics.median(t[1:]) for part, t in by_part.items()}
              for switch, by_part in times.items()}  # first repeat: warm-up
    for switch, name in (("0", "fairseq (ELECTRA_SPEED=0)"), ("1", "electra_adam")):
        ms = result[switch]
        print(f"{name:>26}: multiply_grads {ms['multiply_grads']:.2f} ms, clip_grad_norm "
              f"{ms['clip_grad_norm']:.2f} ms, both {sum(ms.values()):.2f} ms")
    print(f"clip_grad_norm fairseq / electra_adam: "
          f"{result['0']['clip_grad_norm'] / result['1']['clip_grad_norm']:.2f}x; both: "
          f"{sum(result['0'].values()) / sum(result['1'].values()):.2f}x")
    return result


# ------------------------------------------------------------------------------ data loading


def data_corpus(args, arch, length, data_root, batch_size, batches):
    """``--data-dir``, or a train split of random blocks the harness writes (at least
    ``batches`` batches of ``batch_size``): the binarized corpus the loader rows read."""
    if args.data_dir:
        return args.data_dir
    data_dir = write_dictionary(data_root / f"data{args.vocab}", args.vocab)
    sequences = batch_size * (batches + 1)
    if not (data_dir / "train.bin").exists() or \
            int((data_dir / "sequences").read_text()) < sequences:
        write_binarized(data_dir, electra_task(data_dir, arch, length), sequences, length)
        (data_dir / "sequences").write_text(str(sequences))
    return data_dir


def loader_seconds(task, batch_size, batches):
    """(wall, CPU) seconds per batch of one fairseq loader worker on one core: the items of
    each batch and the dataset's collater (masking, padding), what torch's DataLoader runs
    in a worker process (which sets one thread), on the first ``batches`` batches of epoch
    1. The CPU time (this thread's) is the figure for a core of one's own on a shared host."""
    dataset = task.dataset("train")
    plan = task.get_batch_iterator(dataset, max_sentences=batch_size, seed=1,
                                   epoch=1).frozen_batches
    if len(plan) < batches or len(plan[batches - 1]) < batch_size:
        raise RuntimeError(f"the corpus has fewer than {batches} batches of {batch_size}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    times, cpu_times = [], []
    try:
        for indices in plan[:batches]:
            start, cpu = time.perf_counter(), time.thread_time()
            dataset.collater([dataset[i] for i in indices])
            times.append(time.perf_counter() - start)
            cpu_times.append(time.thread_time() - cpu)
    finally:
        torch.set_num_threads(threads)
    return times, cpu_times


def data_rows(args, arch, length, data_root):
    """Masked sequences/s of one loader worker on one core, for the task's masking and
    --whole-word-mask, with this checkout's task and (``--baseline``) REV's, in interleaved
    repeats."""
    batch_size, batches = args.data_batch_size, args.data_batches
    data_dir = data_corpus(args, arch, length, data_root, batch_size, batches)
    package = plugin_at_revision(args.baseline, Path(tempfile.mkdtemp(dir=data_root))) \
        if args.baseline else None
    tasks = {}
    for masking in ([], ["--whole-word-mask"]):
        task = electra_task(data_dir, arch, length, masking)
        impls = [("plugin", task)]
        if package is not None:
            impls.append((f"plugin@{args.baseline}",
                          package.tasks.electra_pretraining.ElectraPretrainingTask.setup_task(
                              task.cfg)))
        for name, t in impls:
            t.load_dataset("train")
            loader_seconds(t, batch_size, 1)  # warm-up: page cache, first-call costs
            tasks[name, " ".join(masking)] = t
    seconds = {key: [] for key in tasks}
    cpu_seconds = {key: [] for key in tasks}
    for _ in range(args.repeats):
        for key, t in tasks.items():
            wall, cpu = loader_seconds(t, batch_size, batches)
            seconds[key].append(statistics.median(wall))
            cpu_seconds[key].append(statistics.median(cpu))
    rows = []
    for (impl, masking), repeats in seconds.items():
        cpu = statistics.median(cpu_seconds[impl, masking])
        row = dict(arch=arch, length=length, batch_size=batch_size, impl=impl, masking=masking,
                   corpus=str(args.data_dir or "random blocks"),
                   sequences_per_s=batch_size / statistics.median(repeats),
                   ms_per_batch=1e3 * statistics.median(repeats),
                   ms_per_batch_repeats=[1e3 * t for t in repeats],
                   sequences_per_cpu_s=batch_size / cpu, cpu_ms_per_batch=1e3 * cpu)
        if impl == "plugin" and (f"plugin@{args.baseline}", masking) in seconds:
            row["vs_baseline"] = statistics.median(
                b / a for a, b in zip(repeats, seconds[f"plugin@{args.baseline}", masking]))
        rows.append(row)
    return rows


def data_table(rows):
    lines = []
    for r in rows:
        speedup = f" = {r['vs_baseline']:.1f}x the baseline" if "vs_baseline" in r else ""
        lines.append(f"data {r['arch']} T={r['length']} B={r['batch_size']} {r['impl']}"
                     f"{' ' + r['masking'] if r['masking'] else ''}: "
                     f"{r['sequences_per_s']:.0f} masked sequences/s per loader worker "
                     f"(1 thread), {r['ms_per_batch']:.1f} ms/batch{speedup}; per CPU "
                     f"second of the worker {r['sequences_per_cpu_s']:.0f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ fairseq-train


def fairseq_train_wps(args, arch, length, flags, data_root, updates):
    """Run fairseq-train on random binarized blocks; median wps of its log lines."""
    data_dir = write_dictionary(data_root / f"train{args.vocab}", args.vocab)
    task = electra_task(data_dir, arch, length)
    write_binarized(data_dir, task, args.batch_size * (updates + 2), length)
    cmd = [sys.executable, "-m", "fairseq_cli.train", str(data_dir),
           "--user-dir", str(PLUGIN), "--task", "electra", "--criterion", "electra",
           "--arch", arch, "--tokens-per-sample", str(length), "--batch-size",
           str(args.batch_size), "--optimizer", "electra_adam", "--adam-betas", str(BETAS),
           "--adam-eps", str(EPS), "--weight-decay", str(WEIGHT_DECAY), "--clip-norm",
           str(CLIP_NORM), "--lr", str(LR), "--lr-scheduler", "polynomial_decay",
           "--warmup-updates", "10000", "--total-num-update", "1000000",
           "--max-update", str(updates), "--disable-validation", "--no-save",
           "--log-format", "json", "--log-interval", "1", "--no-progress-bar",
           "--num-workers", "0", "--data-buffer-size", "0", "--seed", "1",
           # one GPU, as the harness: fairseq-train would take every GPU of the machine
           "--distributed-world-size", "1",
           *flags, *args.plugin_args] + (["--cpu"] if args.device == "cpu" else [])
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode:
        raise RuntimeError(f"fairseq-train failed:\n{proc.stderr[-3000:]}")
    wps = [float(json.loads(line[line.index("{"):])["wps"])
           for line in proc.stdout.splitlines() if "| train_inner |" in line]
    return wps[2:]  # the first updates warm up allocator and kernels


def fairseq_train_check(args, arch, length, precision, device, data_root):
    """fairseq-train's logged wps (with the precision's recommended flags) against this
    harness's plugin step timed just before and just after it (the machine's load drifts;
    both sides see the same drift)."""
    mode, flags = plugin_modes(precision, device)[0]
    runner = PluginStep(write_dictionary(data_root / f"dict{args.vocab}", args.vocab), arch,
                        length, args.batch_size, device, flags, extra=args.plugin_args)
    batches = make_batches(runner.task, args.steps, args.batch_size, length, seed=2)
    batches = [(s.to(device), t.to(device)) for s, t in batches]

    def harness():
        return [args.batch_size * length / time_steps(runner, batches, device)
                for _ in range(args.repeats)]

    runner.step(*batches[0])
    ours = harness()
    wps = fairseq_train_wps(args, arch, length, flags, data_root, args.fairseq_train_updates)
    ours += harness()
    return dict(arch=arch, length=length, precision=precision, mode=mode,
                fairseq_train_wps=statistics.median(wps), fairseq_train_wps_updates=wps,
                harness_tokens_per_s=statistics.median(ours), harness_repeats=ours,
                ratio=statistics.median(wps) / statistics.median(ours))


# ------------------------------------------------------------------------------ report


def table(rows, peaks):
    head = (f"{'config':<30} {'impl':<29} {'tokens/s':>8} {'ms/upd':>7} {'peak MB':>7} "
            f"{'GFLOP/s':>7} {'MFU':>6} {'vs peer':>7} {'vs p-ret':>8} {'speedup':>7} "
            f"{'paper GF':>8} {'exec GF':>7} {'faults':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['vs_peer']:.2f}x" if "vs_peer" in r else ""
        retained = f"{r['vs_peer_retained']:.2f}x" if "vs_peer_retained" in r else ""
        speedup = f"{r['vs_baseline']:.2f}x" if "vs_baseline" in r else ""
        mfu = r["achieved_flops_per_s"] / peaks[r["precision"]]
        lines.append(
            f"{r['config']:<30} {r['impl']:<29} {r['tokens_per_s']:>8.0f} "
            f"{r['ms_per_update']:>7.0f} {r['peak_memory_bytes'] / 2**20:>7.0f} "
            f"{r['achieved_flops_per_s'] / 1e9:>7.1f} {100 * mfu:>5.1f}% {ratio:>7} {retained:>8} "
            f"{speedup:>7} {r['paper_flops_per_update'] / 1e9:>8.1f} "
            f"{r['executed_flops_per_update'] / 1e9:>7.1f} "
            f"{r['page_faults_per_update']:>7.0f}")
    return "\n".join(lines)


def cpu_bf16_units():
    """The CPU's bf16 matrix instructions (/proc/cpuinfo flags) and torch's kernel level:
    without them bf16 matmuls are emulated and bf16 training is slower than fp32."""
    from electra_plugin.environment.bf16_units import cpu_bf16_flags, read_cpuinfo

    return dict(bf16_units=cpu_bf16_flags(read_cpuinfo()) or [],
                torch_cpu_capability=torch.backends.cpu.get_cpu_capability())


def precision_advice(rows):
    """Per configuration, whether the plugin's faster bf16 command line beats its fp32 one."""
    lines = []
    for arch, length in dict.fromkeys((r["arch"], r["length"]) for r in rows):
        speed = {r["impl"].removeprefix("plugin "): r["tokens_per_s"] for r in rows
                 if (r["arch"], r["length"]) == (arch, length)}
        bf16 = {name: speed[name] for name, _ in PLUGIN_MODES["bf16"] if name in speed}
        if "fp32" not in speed or not bf16:
            continue
        best = max(bf16, key=bf16.get)
        ratio = bf16[best] / speed["fp32"]
        head = f"{arch} T={length}: {best} {bf16[best]:.0f} tokens/s = {ratio:.2f}x fp32's " \
               f"{speed['fp32']:.0f}"
        lines.append(f"advice: {head}: bf16 is slower here, train in fp32" if ratio < 1
                     else f"{head}: bf16 pays here, train with {best}")
    return lines


# electra_small's depth with near-zero widths: what is left of an update is host work
NEAR_ZERO = ("--hidden-size", "16", "--num-heads", "4", "--ffn-size", "16",
             "--embedding-size", "16")


def graph_call_clock(runner) -> list:
    """A one-item list that sums the host seconds spent in the calls of ``runner``'s graph,
    the whole update's or else the graphed step's (dynamo's guards and the compiled code:
    what a CUDA graph's replay stands in for on a GPU) from now on; an empty list for a row
    without a graph."""
    whole = vars(getattr(runner, "trainer", None) or runner).get("electra_whole_update")
    step = whole.update if whole else getattr(getattr(runner, "model", None), "electra_step",
                                              None)
    compiled = getattr(step, "compiled", None)
    if compiled is None:
        return []
    clock = [0.0]

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return compiled(*args, **kwargs)
        finally:
            clock[0] += time.perf_counter() - start

    step.compiled = timed
    return clock


def count_rows(args, device, root, batch_size=2, length=16, vocab=64):
    """Per update of electra_small's depth at near-zero widths (``NEAR_ZERO``, then
    ``--plugin-args``' own ``--option N`` pairs, for the peer too; B x T =
    ``batch_size`` x ``length``, ``vocab`` entries): aten operators, those that are not views,
    those compiled code issued (one CUDA graph replay on a GPU), host-device syncs, and ms
    per update (median of ``args.repeats`` runs of ``args.steps``), for the plugin as of
    ``--baseline`` (with fairseq's per-update checks, as it ran), the plugin eager, the
    plugin with --graphed-step around fairseq's update and as the whole update
    (speed/whole_update.py; on a GPU replayed as one CUDA graph, ELECTRA_SPEED=+replay) and
    the transformers peer."""
    from electra_plugin.profiling.host_work import HostWork

    model = [*NEAR_ZERO, *args.plugin_args]
    data_dir = write_dictionary(root / f"dict{vocab}", vocab)
    task = electra_task(data_dir, "electra_small", length, model)
    updates = args.steps
    batches = make_batches(task, args.warmup + 1 + updates, batch_size, length)
    batches = [(src.to(device), target.to(device)) for src, target in batches]
    widths = {k[2:].replace("-", "_"): int(v) for k, v in zip(model[::2], model[1::2])}
    cfg = arch_config("electra_small", model)
    graphed = ["--graphed-step", "--torch-compile", args.compile or "inductor"]
    specs = ([("baseline", f"plugin@{args.baseline}", [], "-deferred")] if args.baseline
             else []) + [("plugin", "plugin", [], "1"),
                         ("plugin", "plugin --graphed-step", graphed, "-update"),
                         ("plugin", "plugin, the whole update", graphed,
                          "+replay" if device.type == "cuda" else "1"),
                         ("peer", "peer", [], "1")]
    rows = []
    for impl, name, flags, switch in specs:
        # with --weigh PART, each plugin row is built twice, the second with that speed part
        # off from the start (parts read when the graph compiles, as well as per call), and
        # the two take turns at going first, repeat by repeat
        # (--weigh nothing: an A/A pair, the second switch the same value spelt otherwise)
        other = f"{switch}," if args.weigh == "nothing" else f"{switch},-{args.weigh}"
        switches = [switch] + ([other] if args.weigh and impl != "peer" else [])
        runners = {}
        for s in switches:
            os.environ["ELECTRA_SPEED"] = s  # (the baseline ran fairseq's checks)
            if impl == "peer":
                runner = PeerStep(cfg, vocab, task.dictionary.pad(), device, "fp32")
            else:
                package = plugin_at_revision(args.baseline, root) if impl == "baseline" \
                    else None
                runner = PluginStep(data_dir, "electra_small", length, batch_size, device,
                                    flags + model, package=package, name=name)
                for batch in batches:  # the collater's work, not the update's
                    runner.sample(*batch)
            for src, target in batches[:args.warmup]:
                runner.step(src, target)
            runners[s] = runner
        os.environ["ELECTRA_SPEED"] = switch
        with HostWork() as work:
            runners[switch].step(*batches[args.warmup])
        in_call = graph_call_clock(runners[switch])
        timed, call_ms = {s: [] for s in switches}, []
        for repeat in range(args.repeats):
            for s in switches[::-1] if repeat % 2 else switches:
                os.environ["ELECTRA_SPEED"] = s
                if in_call:
                    in_call[0] = 0.0
                synchronize(device)
                start = time.perf_counter()
                for src, target in batches[args.warmup + 1:]:
                    runners[s].step(src, target)
                synchronize(device)
                timed[s].append((time.perf_counter() - start) / updates * 1000)
                if in_call and s == switch:
                    call_ms.append(in_call[0] / updates * 1000)
        os.environ["ELECTRA_SPEED"] = switch
        rows.append(dict(name=name, operators=work.operators, kernels=work.kernels,
                         in_graph=work.in_graph, graph_kernels=work.graph_kernels,
                         syncs=work.syncs, ms=statistics.median(timed[switch])))
        if in_call:
            rows[-1]["graph_call_ms"] = statistics.median(call_ms)
        weighed = ""
        if len(switches) == 2:
            off = timed[switches[1]]
            rows[-1].update(ms_without_part=statistics.median(off), part=args.weigh,
                            with_part_vs_without=statistics.median(
                                a / b for a, b in zip(timed[switch], off)))
            weighed = (f"; without {args.weigh}: {rows[-1]['ms_without_part']:.2f} ms "
                       f"(with/without, paired: {rows[-1]['with_part_vs_without']:.3f})")
        if "graph_call_ms" in rows[-1]:
            weighed += f"; in the graph's call: {rows[-1]['graph_call_ms']:.2f} ms"
        print(f"{name:>24}: {work.operators:5d} operators, {work.kernels:5d} not views, of "
              f"which {work.kernels - work.graph_kernels:5d} outside compiled code; "
              f"{work.syncs:3d} syncs; {rows[-1]['ms']:7.2f} ms/update{weighed}", flush=True)
    os.environ.pop("ELECTRA_SPEED")
    peer = next(r for r in rows if r["name"] == "peer")
    for r in rows:
        r["host_ms_vs_peer"] = r["ms"] / peer["ms"]
    print(f"(electra_small, {cfg.num_layers} layers, widths {widths}, {batch_size} x {length}, "
          f"vocab {vocab}, {torch.get_num_threads()} threads; ms: median of {args.repeats} x "
          f"{updates} updates)")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=None,
                   help="architectures (default: electra_small on CPU, small and base on GPU)")
    p.add_argument("--lengths", nargs="+", type=int, default=None,
                   help="sequence lengths, one per model (default: official, 128 small, "
                        "512 base)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--precisions", nargs="+", default=None,
                   choices=["fp32", "bf16", "fp16"],
                   help="default: fp32 bf16 on CPU, bf16 fp16 on GPU; the plugin's rows run "
                        "the command lines of each (fp32: no flag; bf16: --autocast-bf16, "
                        "--bf16; fp16: --amp, --fp16), the peer autocast in that dtype")
    p.add_argument("--impls", nargs="+", default=None,
                   choices=["plugin", "peer", "peer-retained", "baseline"],
                   help="what to time (default: plugin, peer and on CPU peer-retained, the "
                        "peer with the plugin's allocator setting; plus baseline with "
                        "--baseline)")
    p.add_argument("--baseline", metavar="REV",
                   help="also time the plugin's model and criterion as of git revision REV "
                        "(before/after in the same run)")
    p.add_argument("--steps", type=int, default=6, help="updates per timed repeat")
    p.add_argument("--warmup", type=int, default=2, help="untimed updates first")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (median reported)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   choices=["cpu", "cuda"])
    p.add_argument("--fairseq-train", action="store_true",
                   help="also run fairseq-train on random binarized blocks with each "
                        "precision's first command line (fp32, --autocast-bf16, --amp) and "
                        "compare its logged wps with this harness's figure for it")
    p.add_argument("--fairseq-train-updates", type=int, default=14)
    p.add_argument("--breakdown", action="store_true",
                   help="also time the parts of the plugin's step (generator, sampling, "
                        "discriminator, optimizer, data) one at a time")
    p.add_argument("--profile", action="store_true",
                   help="also run each row once more under torch.profiler: the device's busy "
                        "ms per update (its kernels' time) and the operators that take the "
                        "most host time (in the JSON; printed after the table)")
    p.add_argument("--compile", nargs="?", const="inductor", default=None,
                   choices=["inductor", "aot_eager"],
                   help="also time each precision's first plugin command line with "
                        "--torch-compile (default backend: inductor)")
    p.add_argument("--graphed", nargs="?", const=True, default=None,
                   choices=[True, "inductor", "aot_eager"], metavar="BACKEND",
                   help="also time each precision's first plugin command line with "
                        "--graphed-step (the whole step as one graph; BACKEND, else "
                        "--compile's when given, else the plugin's default)")
    p.add_argument("--graphed-speed", nargs="+", action="extend", default=[],
                   metavar="SWITCH",
                   help="with --graphed: the graphed row once more under each ELECTRA_SPEED "
                        "value (e.g. -gradients: the backward by autograd), in the same run; "
                        "repeatable (--graphed-speed=-gradients --graphed-speed +replay)")
    p.add_argument("--clip", action="store_true",
                   help="only time fairseq's gradient scaling and clipping over each model's "
                        "parameters, ELECTRA_SPEED on and off")
    p.add_argument("--data-dir", type=Path,
                   help="a binarized corpus (dict.txt, train.bin/idx) for the data rows "
                        "(default: random blocks the harness writes)")
    p.add_argument("--data-batch-size", type=int, default=128,
                   help="sequences per batch of the data rows (official electra_small: 128)")
    p.add_argument("--data-batches", type=int, default=10,
                   help="batches per timed repeat of the data rows")
    p.add_argument("--data-only", action="store_true",
                   help="time only the data rows (masked sequences/s of one loader worker)")
    p.add_argument("--plugin-args", nargs=argparse.REMAINDER, default=[],
                   help="extra fairseq options for the plugin (last on the line); with "
                        "--count, its --option N pairs shape the peer too")
    p.add_argument("--count", action="store_true",
                   help="only count what an update asks of the host at electra_small's "
                        "depth with near-zero widths: aten operators, host syncs and ms per "
                        "update, for the plugin (and as of --baseline), the plugin with "
                        "--graphed-step (--compile's backend) and the peer")
    p.add_argument("--weigh", metavar="PART", choices=[*PARTS, "nothing"],
                   help="with --count: each plugin row also built and timed with "
                        "ELECTRA_SPEED's PART off (-PART), repeat by repeat in the same "
                        "process; nothing: the same row twice (A/A)")
    p.add_argument("--json", type=Path, help="write all results here")
    args = p.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)
    gpu = device.type == "cuda"
    models = args.models or (["electra_small", "electra_base"] if gpu else ["electra_small"])
    lengths = args.lengths or [OFFICIAL_LENGTH[m] for m in models]
    if len(lengths) == 1:
        lengths = lengths * len(models)
    if args.count:
        quiet()
        with tempfile.TemporaryDirectory() as tmp:
            rows = count_rows(args, device, Path(tmp))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return
    if args.clip:
        quiet()
        with tempfile.TemporaryDirectory() as tmp:
            for arch in models:
                clip_ms(args, arch, device, Path(tmp))
        return
    # peer-retained differs from peer only in the CPU allocator setting
    args.impls = args.impls or (["plugin", "peer"] + ([] if gpu else ["peer-retained"])
                                + (["baseline"] if args.baseline else []))
    if "baseline" in args.impls and not args.baseline:
        sys.exit("--impls baseline needs --baseline REV")
    precisions = args.precisions or (["bf16", "fp16"] if gpu else ["fp32", "bf16"])
    if "fp16" in precisions and not gpu:
        print("fp16 on CPU: fairseq's --amp autocasts on CUDA only, so it computes in fp32 "
              "here; --fp16 needs --fp16-no-flatten-grads")

    quiet()
    machine = dict(
        device=torch.cuda.get_device_name(device) if gpu else platform.processor() or
        platform.machine(), threads=torch.get_num_threads(), torch=torch.__version__,
        python=platform.python_version(), command=" ".join([Path(sys.argv[0]).name] +
                                                           sys.argv[1:]),
        load_average=os.getloadavg(), **({} if gpu else cpu_bf16_units()))
    if args.data_only:
        precisions = []
    peaks = {x: matmul_peak(device, x, args.repeats) for x in precisions}
    print(f"{machine['device']}, {machine['threads']} threads, torch {machine['torch']}, "
          f"load average {machine['load_average'][0]:.2f}")
    if not gpu:
        print("CPU bf16 matrix units: " + (", ".join(machine["bf16_units"]) or
                                           "none (no amx_bf16 or avx512_bf16 flag)")
              + f"; torch CPU kernels: {machine['torch_cpu_capability']}")
    if peaks:
        print("matmul peak: " + ", ".join(f"{x} {v / 1e9:.0f} GFLOP/s"
                                          for x, v in peaks.items()))
    rows, data = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for arch, length in zip(models, lengths):
            config_data = data_rows(args, arch, length, Path(tmp))
            data += config_data
            print(data_table(config_data), flush=True)
            for precision in precisions:
                config_rows = run_config(args, arch, length, precision, device, Path(tmp))
                rows += config_rows
                print(table(config_rows, peaks).split("\n", 2)[-1], flush=True)
        for r in rows:
            r["mfu"] = r["achieved_flops_per_s"] / peaks[r["precision"]]
        parts = []
        if args.breakdown:
            for arch, length in zip(models, lengths):
                for precision in precisions:
                    parts.append(dict(arch=arch, length=length, precision=precision,
                                      **breakdown(args, arch, length, precision, device,
                                                  Path(tmp), max(args.steps, 4))))
        train = []
        if args.fairseq_train:
            for arch, length in zip(models, lengths):
                for precision in precisions:
                    if "plugin" in args.impls:
                        train.append(fairseq_train_check(args, arch, length, precision,
                                                         device, Path(tmp)))
    print()
    if rows:
        print(table(rows, peaks))
    print(data_table(data))
    for b in parts:
        inner = ("generator", "sampling", "discriminator", "losses")
        rest = b["step"] - sum(b[k] for k in ("forward", "backward", "optimizer"))
        print(f"breakdown {b['arch']} T={b['length']} {b['precision']}: step {b['step']:.0f} ms = "
              f"forward {b['forward']:.0f} ("
              + ", ".join(f"{k} {b[k]:.0f}" for k in inner)
              + f"), backward {b['backward']:.0f}, optimizer {b['optimizer']:.0f}, rest "
              f"{rest:.0f}; data (not in the step) {b['data']:.0f} ms/batch")
    for r in rows:
        if "top_host_ops" in r:
            print(f"profile {r['config']} {r['impl']}: device busy "
                  f"{r['device_busy_ms_per_update']:.1f} of {r['ms_per_update']:.1f} ms/update; "
                  "host ms/update by operator: " + ", ".join(
                      f"{name} {host:.2f} ({calls:g} calls)"
                      for name, calls, host, _ in r["top_host_ops"][:6]))
    for t in train:
        print(f"fairseq-train {t['arch']} {t['mode']}: {t['fairseq_train_wps']:.0f} wps "
              f"= {t['ratio']:.2f}x the harness's {t['harness_tokens_per_s']:.0f} tokens/s")
    advice = precision_advice(rows)
    print("\n".join(advice))
    if args.json:
        args.json.write_text(json.dumps(dict(machine=machine, matmul_peak_flops=peaks,
                                             rows=rows, data=data, breakdown=parts,
                                             fairseq_train=train, advice=advice), indent=1))


if __name__ == "__main__":
    main()
