"""Check that a refactor changed no number: this working tree against a git revision.

Usage:
    OMP_NUM_THREADS=1 python benchmarks/compare_revisions.py REV [NAME ...] [--out DIR]
        [--variant 'NAME=NEW OPTIONS[|REV OPTIONS]' ...]
    (--out default: work_dirs/compare_revisions)

REV's ``electra_plugin`` is extracted with ``git archive``; each side runs in its own
subprocess with PYTHONPATH and ``--user-dir`` at its own tree. A variant is a list of
fairseq-train options for this tree and, where the spellings differ, another for REV. NAME
picks built-in variants (default: all of them); ``--variant`` adds one (``seed=|--seed 4``:
no options here, ``--seed 4`` at REV). The built-in variants' REV options are the spellings
before the generators/objectives packages (REV with the single ``electra_plugin/models/generators.py``,
e.g. 2b60e05); at a later REV both sides get this tree's options.

Each side, on a tiny templated corpus the tool binarizes itself and ELECTRA-tiny shrunk to
2 layers of 64:
  (a) in process, through fairseq's public entry points: the gradient of every parameter
      after one seeded forward/backward of model + criterion on the first batch; then 3
      ``Trainer.train_step`` updates on the first batches of a non-shuffled iterator, each
      with the criterion's loss and logging output, the trainer's logged values and every
      parameter after the update; the final state_dict;
  (b) a real ``python -m fairseq_cli.train`` of 4 updates: the train_inner JSON lines
      without timing fields, and the final checkpoint's model weights.
Tensors compare with torch.equal, numbers exactly. Keys on one side only are listed; a new
``version`` buffer on this side is expected (the checkpoint format). Exit 1 if any variant
differs. Both sides' captures are saved under --out (torch.save) for inspection.
"""

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SIZES = ["--arch", "electra_tiny", "--num-layers", "2", "--hidden-size", "64", "--num-heads",
         "4", "--ffn-size", "128", "--embedding-size", "32"]
COMMON = ["--task", "electra", "--criterion", "electra", *SIZES, "--cpu",
          "--tokens-per-sample", "32", "--batch-size", "8", "--num-workers", "0",
          "--data-buffer-size", "0", "--optimizer", "adam", "--lr", "5e-4",
          "--lr-scheduler", "polynomial_decay", "--warmup-updates", "2",
          "--total-num-update", "100", "--seed", "3"]
TIMING = {"wps", "ups", "wall", "train_wall", "gb_free"}  # the only run-dependent log fields
NEW_ONLY_KEYS = {"version"}  # the checkpoint-format buffer this tree adds
# name: (options here, options before the generators/objectives packages or None: the same)
VARIANTS = {
    "electra": ([], None),
    "electra_15": (["--objective", "electra_15"], None),
    "replace_mlm": (["--objective", "replace_mlm"], None),
    "all_tokens_mlm": (["--objective", "all_tokens_mlm"], None),
    "mlm": (["--objective", "mlm"], None),
    "unigram": (["--generator", "unigram"], None),
    "unigram+all_tokens_mlm": (["--generator", "unigram", "--objective", "all_tokens_mlm"], None),
    "adversarial": (["--generator", "adversarial"], ["--generator-training", "adversarial"]),
    "adversarial+electra_15": (["--generator", "adversarial", "--objective", "electra_15"],
                               ["--generator-training", "adversarial", "--objective",
                                "electra_15"]),
    "tied": (["--generator", "tied"], ["--generator-size", "1.0", "--tie-generator"]),
    "two_stage": (["--generator", "two_stage", "--two-stage-updates", "2"],
                  ["--generator-size", "1.0", "--two-stage-updates", "2"]),
    "untied": (["--embedding-sharing", "untied"], ["--untie-embeddings"]),
    "gdes": (["--embedding-sharing", "gdes"], None),
    "generator_layers": (["--generator-layers", "0.5"], None),
    "temperature0": (["--temperature", "0"], None),
    "electric": (["--objective", "electric", "--generator", "two_tower"], None),
    "layer_decay": (["--optimizer", "electra_adam", "--layer-decay", "0.8"], None),
    # each body, with padded batches (the modern body's unpadded rows) and its own variants
    "deberta": (["--encoder-body", "deberta", "--sample-break-mode", "eos"], None),
    "deberta+gdes+emd": (["--encoder-body", "deberta", "--embedding-sharing", "gdes",
                          "--enhanced-mask-decoder"], None),
    "modern": (["--encoder-body", "modern", "--sample-break-mode", "eos"], None),
    "modern+layer_decay": (["--encoder-body", "modern", "--optimizer", "electra_adam",
                            "--layer-decay", "0.8"], None),
}


# ------------------------------------------------------------------ one side, in its subprocess

def capture(plugin: str, data: str, opts: list, out: str) -> None:
    """(a): gradients of one forward/backward, 3 Trainer updates, the final state_dict."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    argv = [data, "--user-dir", plugin, *COMMON, *opts]
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_training_parser(), input_args=argv))
    import electra_plugin
    assert electra_plugin.__file__.startswith(plugin), (electra_plugin.__file__, plugin)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    trainer.begin_epoch(1)
    batches = trainer.get_train_iterator(epoch=1).next_epoch_itr(shuffle=False)
    samples = [next(batches) for _ in range(3)]

    model.train()
    utils.set_torch_seed(cfg.common.seed)
    criterion(model, samples[0])[0].backward()
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    # the criterion's own output in each step: the loss and logging output before fairseq
    # reduces them (its reduced values are rounded for the log)
    raw = []
    criterion.register_forward_hook(lambda module, inputs, output: raw.append(output))
    steps = []
    for sample in samples:
        logs = trainer.train_step([sample])
        loss, _, logging_output = raw.pop()
        steps.append({"loss": loss.detach().clone(),
                      "logging_output": {k: _plain(v) for k, v in logging_output.items()},
                      "logs": {k: _plain(v) for k, v in logs.items() if k not in TIMING},
                      "params": {n: p.detach().clone() for n, p in model.named_parameters()}})
    torch.save({"plugin": electra_plugin.__file__, "grads": grads, "steps": steps,
                "state_dict": model.state_dict()}, out)


def _plain(value):
    return value.detach().clone() if torch.is_tensor(value) else value


def run_train(tree: Path, data: Path, opts: list, save_dir: Path) -> dict:
    """(b): a real fairseq-train of 4 updates -> its train_inner lines and final weights."""
    cmd = [sys.executable, "-m", "fairseq_cli.train", str(data), "--user-dir",
           str(tree / "electra_plugin"), *COMMON, *opts, "--max-update", "4",
           "--log-format", "json", "--log-interval", "1", "--no-progress-bar",
           "--disable-validation", "--no-epoch-checkpoints", "--save-dir", str(save_dir)]
    proc = subprocess.run(cmd, cwd=tree, env=_env(tree), capture_output=True, text=True)
    if proc.returncode:
        raise Failed("fairseq-train", tree, proc)
    lines = [json.loads(line.split("| train_inner | ", 1)[1])
             for line in (proc.stdout + proc.stderr).splitlines() if "| train_inner | " in line]
    checkpoint = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu",
                            weights_only=False)
    return {"train_inner": [{k: v for k, v in line.items() if k not in TIMING}
                            for line in lines], "weights": checkpoint["model"]}


class Failed(Exception):
    def __init__(self, what, tree, proc):
        last = [line for line in proc.stderr.splitlines() if line.strip()][-1:]
        side = "this tree" if tree == REPO else "REV"
        super().__init__(f"{what} failed at {side}: {' '.join(last)}")


def _env(tree: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


# ------------------------------------------------------------------------------ comparison

def differences(new, old, path=""):
    """-> (differences, keys on the new side only that are expected), as readable lines."""
    if isinstance(new, dict) and isinstance(old, dict):
        diffs, expected = [], []
        for key in [*new, *(key for key in old if key not in new)]:  # capture order
            where = f"{path}.{key}" if path else str(key)
            if key not in old:
                if str(key).split(".")[-1] in NEW_ONLY_KEYS:
                    expected.append(where)
                else:
                    diffs.append(f"{where}: only in this tree")
            elif key not in new:
                diffs.append(f"{where}: only at REV")
            else:
                d, e = differences(new[key], old[key], where)
                diffs += d
                expected += e
        return diffs, expected
    if isinstance(new, list) and isinstance(old, list):
        if len(new) != len(old):
            return [f"{path}: {len(new)} vs {len(old)} entries"], []
        pairs = [differences(n, o, f"{path}[{i}]") for i, (n, o) in enumerate(zip(new, old))]
        return [d for p in pairs for d in p[0]], [e for p in pairs for e in p[1]]
    if torch.is_tensor(new) and torch.is_tensor(old):
        if new.shape != old.shape or new.dtype != old.dtype:
            return [f"{path}: {tuple(new.shape)} {new.dtype} vs {tuple(old.shape)} "
                    f"{old.dtype}"], []
        if torch.equal(new, old) or (new.is_floating_point() and bool(
                ((new == old) | (new.isnan() & old.isnan())).all())):
            return [], []
        delta = (new.double() - old.double()).abs().nan_to_num(math.inf).max().item()
        return [f"{path}: max |diff| {delta:.3g}"], []
    both_nan = isinstance(new, float) and isinstance(old, float) and math.isnan(new) \
        and math.isnan(old)
    if new == old or both_nan:
        return [], []
    return [f"{path}: {new!r} vs {old!r}"], []


def write_corpus(path: Path, sentences: int, seed: int) -> None:
    rng = random.Random(seed)
    words = [["the cat", "a dog", "my neighbour", "the old man", "the teacher", "a red bird"],
             ["sees", "likes", "builds", "paints", "follows", "carries"],
             ["a house", "the ball", "an apple", "the long road", "a quiet song", "the letter"],
             ["today", "in the park", "near the station", "after dinner", ""]]
    lines = [" ".join(w for w in map(rng.choice, words) if w) + " ." for _ in range(sentences)]
    path.write_text("\n".join(lines) + "\n")


def binarize(work: Path) -> Path:
    from fairseq import options
    from fairseq_cli import preprocess

    write_corpus(work / "train.txt", 400, 1)
    write_corpus(work / "valid.txt", 40, 2)
    preprocess.main(options.get_preprocessing_parser().parse_args([
        "--only-source", "--destdir", str(work / "data"), "--workers", "1",
        "--trainpref", str(work / "train.txt"), "--validpref", str(work / "valid.txt")]))
    return work / "data"


def side(tree: Path, data: Path, opts: list, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, __file__, "--capture", str(tree / "electra_plugin"),
                           str(data), str(out / "in_process.pt"), "--", *opts],
                          cwd=tree, env=_env(tree), capture_output=True, text=True)
    if proc.returncode:
        raise Failed("the in-process capture", tree, proc)
    captured = {"in_process": torch.load(out / "in_process.pt")}
    captured["fairseq_train"] = run_train(tree, data, opts, out / "checkpoints")
    torch.save(captured["fairseq_train"], out / "fairseq_train.pt")
    print(f"  {tree}: {captured['in_process'].pop('plugin')}", flush=True)
    return captured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rev", help="the git revision to compare this working tree against")
    parser.add_argument("names", nargs="*", help=f"built-in variants: {', '.join(VARIANTS)}")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=NEW OPTIONS[|REV OPTIONS] (more than once)")
    parser.add_argument("--out", type=Path, default=REPO / "work_dirs" / "compare_revisions")
    args = parser.parse_args()
    unknown = set(args.names) - set(VARIANTS)
    if unknown:
        parser.error(f"no built-in variant {', '.join(sorted(unknown))}")
    old_spellings = subprocess.run(
        ["git", "cat-file", "-e", f"{args.rev}:electra_plugin/models/generators.py"], cwd=REPO,
        capture_output=True).returncode == 0
    variants = {name: (new, old if old_spellings and old is not None else new)
                for name, (new, old) in VARIANTS.items()
                if name in args.names or not (args.names or args.variant)}
    for spec in args.variant:
        name, _, opts = spec.partition("=")
        new, _, old = opts.partition("|")
        variants[name] = (new.split(), (old if "|" in opts else new).split())

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        archive = subprocess.run(["git", "archive", args.rev, "electra_plugin"], cwd=REPO,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        data = binarize(tmp)
        for name, (new_opts, old_opts) in variants.items():
            print(f"{name}: {' '.join(new_opts) or '(defaults)'} | "
                  f"{' '.join(old_opts) or '(defaults)'}", flush=True)
            out = args.out / name
            try:
                results[name] = differences(side(REPO, data, new_opts, out / "new"),
                                            side(tmp, data, old_opts, out / "rev"))
            except Failed as failed:
                results[name] = [str(failed)], []

    print(f"\n{'variant':<24} result (this tree vs {args.rev})")
    for name, (diffs, expected) in results.items():
        note = f" (only in this tree, as expected: {', '.join(expected)})" if expected else ""
        print(f"{name:<24} {'identical' + note if not diffs else f'DIFFERS in {len(diffs)}:'}")
        for line in diffs[:8]:
            print(f"{'':<26}{line}")
    return int(any(diffs for diffs, _ in results.values()))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--capture"]:
        plugin, data, out, _, *opts = sys.argv[2:]
        capture(plugin, data, opts, out)
    else:
        sys.exit(main())
