"""The demo's reusable pieces: the fairseq command lines of its recipe, its progress lines and
curves read from a fairseq log, and the discriminator at work on a held-out sentence.

``scripts/demo.py`` strings them together with the data fetchers (which stay out of the
plugin); the tests and the studies under examples/ use them as they are.
"""

import logging
import os
import re
import sys

from ..environment.locations import user_dir
from ..environment.optional import require
from ..user_io.partial_output import written_whole

PLUGIN = user_dir()


def pretrain_cmd(data, save_dir, updates, seed, log_path):
    """fairseq-train: ELECTRA-tiny pre-training on CPU with the official recipe, scaled down."""
    return [
        sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN,
        "--task", "electra", "--criterion", "electra", "--arch", "electra_tiny", "--cpu",
        "--tokens-per-sample", "128", "--batch-size", "32", "--optimizer", "electra_adam",
        "--adam-eps", "1e-6", "--weight-decay", "0.01", "--lr", "1e-3", "--clip-norm", "1.0",
        "--lr-scheduler", "polynomial_decay", "--warmup-updates", str(updates // 10),
        "--total-num-update", str(updates), "--max-update", str(updates),
        "--save-dir", save_dir, "--no-epoch-checkpoints", "--save-interval-updates",
        "400", "--keep-interval-updates", "1", "--validate-interval-updates", "200",
        "--log-format", "simple", "--log-interval", "50", "--num-workers", "0",
        "--data-buffer-size", "0", "--seed", str(seed), "--log-file", log_path]


def finetune_cmd(data, save_dir, updates, seed, restore=None, model=("--arch", "electra_tiny")):
    """fairseq-train on the sentiment data with ELECTRA's fine-tuning recipe, scaled down: the
    trials' command (one builder) with the demo's lr and no layer-wise lr decay.

    No layer-wise lr decay: the official 0.8 (for 12 layers) left a 4-layer model pre-trained
    at small compute at chance for ~700 of 900 updates; without it, it leaves chance by
    update ~200 (docs/objectives.md, recipe search)."""
    from ..finetuning.trials import Recipe, Start, Trial, finetune_command, parse_task

    trial = Trial(parse_task(f"SST-2={data}"), Start("demo", tuple(model), restore), seed,
                  os.fspath(save_dir))
    return finetune_command(trial, Recipe(lr=3e-4, layer_decay=1.0, max_update=updates,
                                          cpu=True, extra=("--no-save-optimizer-state",)))


def dev_accuracy_cmd(data, save_dir):
    """electra-glue evaluate on the final fine-tuned checkpoint (the dev set picks nothing);
    prints one JSON line last."""
    return [sys.executable, "-m", "electra_plugin.cli.glue", "evaluate", "--task", "SST-2",
            "--checkpoint", os.path.join(save_dir, "checkpoint_last.pt"), "--data", data,
            "--json"]


def preset_cmd(data, save_dir, updates, seed, log_path, preset, run_dir, config_dir):
    """fairseq-hydra-train with a pre-training preset (a yaml of ``config_dir``, the
    repository's examples/pretraining/config)."""
    return [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", config_dir,
            "--config-name", preset, f"task.data={os.path.abspath(data)}",
            f"common.user_dir={PLUGIN}", f"common.seed={seed}",
            f"common.log_file={os.path.abspath(log_path)}",
            f"checkpoint.save_dir={os.path.abspath(save_dir)}",
            f"optimization.max_update={updates}", f"lr_scheduler.total_num_update={updates}",
            f"lr_scheduler.warmup_updates={updates // 10}", f"hydra.run.dir={run_dir}"]


TRAIN_STAT = re.compile(r"(\w+)=([-+\w.]+)")  # "loss=25.9, gen_acc=10.1, ..."
VALID_STAT = re.compile(r"\| (\w+) ([-+\w.]+)")  # "| loss 25.9 | gen_acc 10.1 | ..."


def log_stats(line):
    """(kind, {metric: value}) of a fairseq log line in the simple format: kind 'valid',
    'train_inner', or None for other lines."""
    if "valid on 'valid' subset" in line:
        kind, found = "valid", VALID_STAT.findall(line)
    elif " loss=" in line:
        kind, found = "train_inner", TRAIN_STAT.findall(line)
    else:
        return None, {}
    stats = {}
    for key, value in found:
        try:
            stats[key] = float(value)
        except ValueError:
            pass
    return kind, stats


def pretraining_progress(total):
    """A line printer for pre-training: update, losses, generator accuracy, disc AUC."""

    def show(line):
        kind, m = log_stats(line)
        if kind is None or "num_updates" not in m:
            return None
        parts = [f"{'valid' if kind == 'valid' else 'train'} {int(m['num_updates']):>5}/{total}"]
        parts += [f"{k} {m[k]:.3f}" for k in ("loss", "gen_loss", "disc_loss") if k in m]
        parts += [f"{k} {m[k]:.1f}%" for k in ("gen_acc", "sampled_acc") if k in m]
        if "disc_acc" in m:
            parts += [f"disc_acc {m['disc_acc']:.1f}% (baseline {m['disc_baseline']:.1f}%)"]
        parts += [f"disc_auc {m['disc_auc']:.3f}"] if "disc_auc" in m else []
        return " | ".join(parts)

    return show


def plot_curves(log_path, png):
    """Losses, generator accuracy and disc AUC of the pre-training log against training
    FLOPs, as a PNG; returns the train_inner records."""
    matplotlib = require("the demo's curves")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = {"train_inner": {}, "valid": {}}  # by update: a resumed run repeats lines
    for line in open(log_path):
        kind, stats = log_stats(line)
        if kind is not None and "num_updates" in stats:
            found[kind][stats["num_updates"]] = stats
    train = [r for r in found["train_inner"].values() if "train_flops" in r]
    valid = list(found["valid"].values())
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    flops = [r["train_flops"] for r in train]
    for ax, keys, title in ((axes[0], ("gen_loss", "disc_loss"), "losses"),
                            (axes[1], ("gen_acc", "sampled_acc", "disc_acc", "disc_baseline"),
                             "accuracy (%)"),
                            (axes[2], ("disc_auc",), "discriminator ROC AUC")):
        for key in keys:
            if any(key in r for r in train):
                ax.plot(flops, [r.get(key, float("nan")) for r in train], label=key)
        ax.set_title(title)
        ax.set_xlabel("training FLOPs")
    axes[2].axhline(0.5, color="grey", linestyle=":", label="chance")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    with written_whole(png) as partial:
        fig.savefig(partial, dpi=100, format="png")
    plt.close(fig)
    return train, valid


def discriminator_at_work(checkpoint, data, sentence):
    """The generator's replacements in a held-out sentence and the discriminator's
    replaced-token probability of every piece, as printable lines."""
    from electra_plugin.models.hub_interface import from_pretrained

    logging.disable(logging.INFO)  # fairseq's loading messages
    hub = from_pretrained(os.path.dirname(checkpoint), os.path.basename(checkpoint),
                          os.path.abspath(data))
    logging.disable(logging.NOTSET)
    lines = []
    for original, read, prob in hub.generate_and_detect(sentence, seed=1):
        mark = f"{original} -> {read}" if read != original else original
        lines.append(f"{prob:6.3f}  {'#' * round(20 * prob):<20}  {mark}"
                     + ("   (replaced)" if read != original else ""))
    return lines


def first_valid_sentence(data, min_pieces=12):
    """A sentence of the held-out split (the pre-training never saw it), as text."""
    from fairseq.data import data_utils

    from electra_plugin.data.dictionary import load_dictionary
    from electra_plugin.data.tokenizer import load_tokenizer

    dictionary = load_dictionary(data)
    dataset = data_utils.load_indexed_dataset(os.path.join(data, "valid"), dictionary)
    tokenizer = load_tokenizer(data)
    for i in range(len(dataset)):
        if min_pieces <= len(dataset[i]) <= 40:
            return tokenizer.detokenize([dictionary[t] for t in dataset[i][:-1]])
    return tokenizer.detokenize([dictionary[t] for t in dataset[0][:40]])
