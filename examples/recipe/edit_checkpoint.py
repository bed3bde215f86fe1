#!/usr/bin/env python
"""A probe's pre-trained checkpoint, edited before fine-tuning: top layers re-initialised or
token embeddings centred. For fine-tuning-side probes of the recipe search; the edited copy
goes into a new probe directory (with the source's pre-training log), the source is kept.

    python examples/recipe/edit_checkpoint.py official official-reinit2 --reinit-top 2
    python examples/recipe/edit_checkpoint.py official official-center --center-embeddings
    python -m examples.recipe.probe official-reinit2 --seeds 1     # fine-tunes the copy
"""

import argparse
import shutil
from pathlib import Path

import torch

from fairseq.data import Dictionary

REPO = Path(__file__).resolve().parents[2]
LAYER = "discriminator.encoder.layer."


def layer_of(key):
    """The discriminator layer a state-dict key belongs to, or None."""
    return int(key[len(LAYER):].split(".")[0]) if key.startswith(LAYER) else None


def reinit_top(model, k, seed=1):
    """The top ``k`` discriminator layers back to BERT's init: N(0, 0.02) weights, zero
    biases, LayerNorm 1/0 (as HF; fairseq's ``init_bert_params`` acts on modules, and this
    edits a checkpoint's tensors without building the model)."""
    depth = 1 + max(layer_of(key) for key in model if key.startswith(LAYER))
    rng = torch.Generator().manual_seed(seed)
    for key, value in model.items():
        if layer_of(key) is None or layer_of(key) < depth - k:
            continue
        if "LayerNorm" in key:
            value.fill_(1.0 if key.endswith("weight") else 0.0)
        elif key.endswith("bias"):
            value.zero_()
        else:
            value.copy_(torch.randn(value.shape, generator=rng) * 0.02)


def center_embeddings(model, specials):
    """Subtract the mean token embedding (specials excluded) from every row: at small
    budgets the tied generator's softmax drifts all rare pieces along one direction."""
    for key in [k for k in model if k.endswith("word_embeddings.weight")]:
        model[key] -= model[key][specials:].mean(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("source", help="probe name under --workdir")
    p.add_argument("target", help="new probe name")
    p.add_argument("--reinit-top", type=int, default=0, help="discriminator layers to reset")
    p.add_argument("--center-embeddings", action="store_true")
    p.add_argument("--workdir", type=Path, default=REPO / "work_dirs" / "recipe")
    args = p.parse_args()
    source, target = args.workdir / args.source, args.workdir / args.target
    if target.exists():
        raise SystemExit(f"edit_checkpoint: {target} exists; pick another target name")
    state = torch.load(source / "pretrain" / "checkpoint_last.pt", map_location="cpu",
                       weights_only=False)
    if args.reinit_top:
        reinit_top(state["model"], args.reinit_top)
    if args.center_embeddings:
        specials = Dictionary().nspecial  # <s> <pad> </s> <unk> lead every dict
        center_embeddings(state["model"], specials)
    (target / "pretrain").mkdir(parents=True)
    torch.save(state, target / "pretrain" / "checkpoint_last.pt")
    shutil.copy(source / "pretrain.log", target / "pretrain.log")


if __name__ == "__main__":
    main()
