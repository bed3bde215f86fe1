#!/usr/bin/env python
"""What a probe's checkpoint holds, without fine-tuning: a linear probe on every layer and
the anisotropy of its token embeddings, next to the same architecture at random init.

Linear probe: logistic regression (scikit-learn) on the mean-pooled features of each layer
(embeddings, then every Transformer layer), standardised per dimension on the training
sentences, fitted on the first 3,000 search-train sentences and scored on the 1,000
search-dev ones. Anisotropy: the mean cosine between the token embeddings of pieces ranked
5-504 by the dictionary's counts, and |mean embedding| / mean |embedding| over all pieces.

    python examples/recipe/diagnose.py official dw1 --random
"""

import argparse
from pathlib import Path

import numpy as np
import torch
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from sklearn.linear_model import LogisticRegression

from electra_plugin.models.hub_interface import from_pretrained

REPO = Path(__file__).resolve().parents[2]


def rows(tsv: Path, limit=None):
    """(sentences, labels) of a sentence<TAB>label file with a header, the first ``limit``."""
    pairs = [line.split("\t") for line in tsv.read_text().splitlines()[1:]][:limit]
    return [sentence for sentence, _ in pairs], np.array([int(label) for _, label in pairs])


def pooled_layers(hub, sentences):
    """N x (layers + 1) x H mean-pooled features."""
    with torch.no_grad():
        return torch.stack([torch.stack([h.reshape(-1, h.shape[-1]).mean(0) for h in
                                         hub.extract_features(hub.encode(s)[:128],
                                                              return_all_hiddens=True)])
                            for s in sentences]).numpy()


def linear_probes(hub, train, dev):
    xtr, xdv = pooled_layers(hub, train[0]), pooled_layers(hub, dev[0])
    accuracies = []
    for layer in range(xtr.shape[1]):
        mean, std = xtr[:, layer].mean(0), xtr[:, layer].std(0) + 1e-8
        clf = LogisticRegression(max_iter=2000).fit((xtr[:, layer] - mean) / std, train[1])
        accuracies.append(round(100 * clf.score((xdv[:, layer] - mean) / std, dev[1]), 1))
    return accuracies


def anisotropy(hub):
    dictionary = hub.task.source_dictionary
    weight = hub.model.discriminator.embeddings.word_embeddings.weight.detach()
    table = weight[dictionary.nspecial:len(dictionary)]  # no specials, no <mask>
    frequent = torch.tensor(dictionary.count[dictionary.nspecial:]).argsort(descending=True)
    unit = torch.nn.functional.normalize(table[frequent[:500]], dim=-1)
    cosines = unit @ unit.T
    mean_cos = (cosines.sum() - cosines.diagonal().sum()) / (len(unit) * (len(unit) - 1))
    return round(mean_cos.item(), 3), round((table.mean(0).norm() /
                                             table.norm(dim=-1).mean()).item(), 3)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("probes", nargs="+", help="probe names under --workdir")
    p.add_argument("--random", action="store_true", help="also the first probe's "
                                                         "architecture at random init")
    p.add_argument("--workdir", type=Path, default=REPO / "work_dirs" / "recipe")
    args = p.parse_args()
    split = args.workdir / "sentiment-search"
    train, dev = rows(split / "train.tsv", 3000), rows(split / "dev.tsv")
    data = str(args.workdir.parent / "demo" / "data-bin")
    runs = [(name, False) for name in args.probes]
    if args.random:
        runs.insert(0, (args.probes[0], True))
    for name, random_init in runs:
        checkpoint = args.workdir / name / "pretrain" / "checkpoint_last.pt"
        hub = from_pretrained(str(checkpoint.parent), checkpoint.name, data).eval()
        if random_init:
            torch.manual_seed(1)
            hub.model.apply(init_bert_params)
        label = "random init" if random_init else name
        print(f"{label}: linear probe by layer {linear_probes(hub, train, dev)}; "
              f"embedding mean cosine, |mean|/mean|e| {anisotropy(hub)}", flush=True)


if __name__ == "__main__":
    main()
