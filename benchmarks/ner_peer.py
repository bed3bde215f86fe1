#!/usr/bin/env python3
"""NER fine-tuning from one checkpoint, two ways, same recipe, same seeds: the plugin's trials
(electra-tag preprocess + electra-finetune trials) against transformers' own token
classification of the same weights (electra-convert export, then
``ElectraForTokenClassification`` trained by the loop below), both scored by seqeval's entity
F1 on the dev file's words.

The recipe is the plugin's default (ELECTRA's official one for the size: Small's for a size
of its own): AdamW, eps 1e-6, weight decay 0.01 except LayerNorm and biases, the size's lr
and layer-wise lr decay (the head at lr, layer i of L at lr * d**(L - i), the embeddings at
lr * d**(L + 1)), 10% linear warm-up then linear decay to 0, clip 1.0, batch 32, 3 epochs,
128 pieces per sentence, a word's label on its first piece. The peer tokenizes with the
exported tokenizer (is_split_into_words) and initialises its classifier as transformers does
(N(0, 0.02)); the plugin's head is Glorot-uniform, as the official code's.

  python scripts/fetch_conll2003.py --out-dir work_dirs/conll2003
  OMP_NUM_THREADS=1 python benchmarks/ner_peer.py \\
      --checkpoint work_dirs/demo/pretrain/checkpoint_last.pt --conll work_dirs/conll2003 \\
      --out-dir work_dirs/ner_peer --seeds 1 2 3 4 5 --jobs 2
"""

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LEN = 128
BATCH = 32
EPOCHS = 3
WARMUP = 0.1
SMALL = (3e-4, 0.8)  # lr, layer decay: the trials' default for a size of its own


def run(cmd, **kwargs):
    print("$ " + " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kwargs)


def read_conll(path):
    from electra_plugin.data.conll import read_conll as read

    return read(path)


# ----------------------------------------------------------------------------- the plugin
def plugin_arm(args):
    data = os.path.join(args.out_dir, "plugin-data")
    if not os.path.isdir(data):
        run([sys.executable, "-m", "electra_plugin.cli.tag", "preprocess", "--pretrain-data",
             args.pretrain_data, "--train", os.path.join(args.conll, "train.conll"), "--valid",
             os.path.join(args.conll, "dev.conll"), "--out-dir", data])
    trials = args.trials_dir or os.path.join(args.out_dir, "plugin")
    run([sys.executable, "-m", "electra_plugin.cli.finetune", "trials", "--checkpoint",
         args.checkpoint, "--task", f"conll2003={data}", "--seeds", *args.seeds, "--jobs",
         args.jobs, "--cpu", "--out-dir", trials])
    found = {}
    for seed in args.seeds:
        with open(os.path.join(trials, "conll2003", f"seed-{seed}", "result.json")) as f:
            found[int(seed)] = json.load(f)["scores"]["conll2003"]["f1"]
    return found


# ------------------------------------------------------------------------- transformers
def encode(sentences, tokenizer, label_ids):
    """input ids, and each piece's label id (-100 but on a word's first piece), and where
    each word starts (None: cut by the length limit)."""
    rows = []
    for s in sentences:
        enc = tokenizer(s.words, is_split_into_words=True, truncation=True,
                        max_length=MAX_LEN)
        labels, first, seen = [], {}, set()
        for position, word in enumerate(enc.word_ids()):
            if word is None or word in seen:
                labels.append(-100)
                continue
            seen.add(word)
            first[word] = position
            labels.append(label_ids[s.labels[word]])
        rows.append((enc["input_ids"], labels, [first.get(w) for w in range(len(s.words))]))
    return rows


def batches(rows, order, pad):
    import torch

    for i in range(0, len(order), BATCH):
        chosen = [rows[j] for j in order[i:i + BATCH]]
        width = max(len(r[0]) for r in chosen)
        ids = torch.full((len(chosen), width), pad)
        labels = torch.full((len(chosen), width), -100)
        for k, (x, y, _) in enumerate(chosen):
            ids[k, :len(x)] = torch.tensor(x)
            labels[k, :len(y)] = torch.tensor(y)
        yield order[i:i + BATCH], ids, ids.ne(pad).long(), labels


def layer_groups(model, lr, decay, weight_decay):
    """AdamW groups: the plugin's depth rule and weight-decay exemptions."""
    layers = model.config.num_hidden_layers
    groups = {}
    for name, p in model.named_parameters():
        if name.startswith("electra.embeddings"):
            depth = 0
        elif name.startswith("electra.encoder.layer."):
            depth = int(name.split(".")[3]) + 1
        else:
            depth = layers + 1
        scale = decay ** (layers + 1 - depth)
        no_decay = "LayerNorm" in name or name.endswith("bias")
        group = groups.setdefault((scale, no_decay), {
            "params": [], "lr": lr * scale, "weight_decay": 0.0 if no_decay else weight_decay})
        group["params"].append(p)
    return list(groups.values())


def peer_seed(args):
    """One transformers fine-tuning run; prints its dev scores as JSON."""
    import torch
    import transformers
    from seqeval.metrics import f1_score

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    hf = os.path.join(args.out_dir, "hf")
    train = read_conll(os.path.join(args.conll, "train.conll"))
    dev = read_conll(os.path.join(args.conll, "dev.conll"))
    from electra_plugin.data.conll import label_list

    labels = label_list(train)
    ids = {label: i for i, label in enumerate(labels)}
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf)
    model = transformers.ElectraForTokenClassification.from_pretrained(
        hf, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=ids)
    if args.peer_init == "glorot":  # the plugin's (official) head init, to attribute a gap
        torch.nn.init.xavier_uniform_(model.classifier.weight)
    train_rows, dev_rows = encode(train, tokenizer, ids), encode(dev, tokenizer, ids)
    updates = math.ceil(len(train_rows) / BATCH) * EPOCHS
    lr, decay = SMALL
    optimizer = torch.optim.AdamW(layer_groups(model, lr, decay, 0.01), lr=lr, eps=1e-6)
    for group in optimizer.param_groups:
        group["initial_lr"] = group["lr"]
    schedule = transformers.get_linear_schedule_with_warmup(
        optimizer, max(1, round(WARMUP * updates)), updates)
    pad = tokenizer.pad_token_id
    model.train()
    start = time.time()
    for epoch in range(EPOCHS):
        order = list(range(len(train_rows)))
        random.Random(args.seed * 1000 + epoch).shuffle(order)
        for _, x, mask, y in batches(train_rows, order, pad):
            loss = model(input_ids=x, attention_mask=mask, labels=y).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
    model.eval()
    predicted = [None] * len(dev)
    with torch.no_grad():
        for chosen, x, mask, _ in batches(dev_rows, list(range(len(dev_rows))), pad):
            best = model(input_ids=x, attention_mask=mask).logits.argmax(-1)
            for k, j in enumerate(chosen):
                predicted[j] = [labels[int(best[k, p])] if p is not None else "O"
                                for p in dev_rows[j][2]]
    gold = [s.labels for s in dev]
    print(json.dumps({"seed": args.seed, "f1": 100 * f1_score(gold, predicted),
                      "updates": updates, "seconds": time.time() - start}))


def peer_arm(args):
    hf = os.path.join(args.out_dir, "hf")
    if not os.path.isdir(hf):
        run([sys.executable, "-m", "electra_plugin.cli.convert", "export", "--checkpoint",
             args.checkpoint, "--out-dir", hf])
    found, pending, running = {}, list(args.seeds), []
    threads = max(1, (os.cpu_count() or 1) // int(args.jobs))
    while pending or running:
        while pending and len(running) < int(args.jobs):
            seed = pending.pop(0)
            cmd = [sys.executable, __file__, "--peer-seed", seed, "--checkpoint",
                   args.checkpoint, "--conll", args.conll, "--out-dir", args.out_dir,
                   "--peer-init", args.peer_init]
            print("$ " + " ".join(map(str, cmd)), flush=True)
            running.append(subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                                            text=True, env=dict(os.environ,
                                                                OMP_NUM_THREADS=str(threads))))
        time.sleep(1)
        for proc in [p for p in running if p.poll() is not None]:
            running.remove(proc)
            if proc.returncode:
                raise SystemExit(f"a transformers run failed (exit {proc.returncode})")
            result = json.loads(proc.stdout.read().strip().splitlines()[-1])
            print(f"  transformers seed {result['seed']}: f1 {result['f1']:.2f} "
                  f"({result['updates']} updates, {result['seconds']:.0f} s)", flush=True)
            found[result["seed"]] = result["f1"]
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="a pre-training checkpoint")
    p.add_argument("--conll", required=True, help="train.conll and dev.conll (CoNLL-2003)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--pretrain-data", help="default: the checkpoint's task.data")
    p.add_argument("--seeds", nargs="+", default=["1", "2", "3", "4", "5"])
    p.add_argument("--jobs", default="2")
    p.add_argument("--trials-dir", help="the plugin's trials here (default OUT_DIR/plugin; a "
                                        "suite's directory shares its finished runs)")
    p.add_argument("--peer-init", choices=("transformers", "glorot"), default="transformers",
                   help="the transformers head's init: its own N(0, 0.02), or Glorot-uniform "
                        "as the plugin's")
    p.add_argument("--peer-only", action="store_true",
                   help="run the transformers arm alone (a probe; the plugin's runs kept)")
    p.add_argument("--peer-seed", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.peer_seed is not None:
        args.seed = args.peer_seed
        return peer_seed(args)
    if args.pretrain_data is None:
        from electra_plugin.finetuning.checkpoint_kind import read_kind

        args.pretrain_data = read_kind(args.checkpoint).cfg["task"]["data"]
    os.makedirs(args.out_dir, exist_ok=True)
    theirs = peer_arm(args)
    if args.peer_only:
        print(json.dumps({"transformers": theirs, "init": args.peer_init}))
        return
    ours = plugin_arm(args)
    seeds = sorted(ours)
    table = ["| seed | plugin (electra-finetune trials) | transformers |", "|---:|---:|---:|"]
    table += [f"| {s} | {ours[s]:.2f} | {theirs[s]:.2f} |" for s in seeds]
    table.append(f"| median | {statistics.median(ours.values()):.2f} | "
                 f"{statistics.median(theirs.values()):.2f} |")
    print("\n".join(table))
    with open(os.path.join(args.out_dir, "ner_peer.json"), "w") as f:
        json.dump({"plugin": ours, "transformers": theirs,
                   "median": {"plugin": statistics.median(ours.values()),
                              "transformers": statistics.median(theirs.values())}}, f,
                  indent=1)


if __name__ == "__main__":
    main()
