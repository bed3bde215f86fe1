#!/usr/bin/env python
"""The encoder bodies at equal training FLOPs: BERT's (the main job's), DeBERTa-v3's and
ModernBERT's, each pre-trained by replaced token detection with the main job's preset
(small_compute: ELECTRA-tiny sizes, its generator, lr, batch) on its corpus until the FLOPs
the main job spends (its 1,200 updates of the BERT body, counted by the paper's rules), then
fine-tuned on the sentiment task by ``electra-finetune trials`` (the demo's recipe, 5 seeds,
final models, medians first). Nothing is chosen on these numbers: every setting is the main
job's.

    python -m examples.bodies.equal_flops          # from the repository root, ~1 h on 2 cores

Results: ``--results``/RESULTS.md (pre-training runs and the trials table) and results.json.
"""

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from fairseq.data import Dictionary
from omegaconf import OmegaConf

from electra_plugin.cli.demo import preset_cmd
from electra_plugin.finetuning import report, trials
from electra_plugin.models.core.config import complete_config
from electra_plugin.models.electra import ElectraModel
from scripts.demo import prepare_corpus, prepare_sentiment

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "examples" / "pretraining" / "config"
LENGTH, BATCH, MAIN_JOB_UPDATES = 128, 32, 1200


def flops_per_update(body: str, vocab: int) -> float:
    """Paper-counted FLOPs of one batch of the preset with ``body`` (15% of the 127 tokens
    after <s> masked)."""
    cfg = complete_config(OmegaConf.create(dict(_name="electra_tiny", encoder_body=body)))
    dictionary = Dictionary()
    while len(dictionary) < vocab - 1:
        dictionary.add_symbol(f"w{len(dictionary)}")
    dictionary.add_symbol("<mask>")
    return ElectraModel(cfg, dictionary, pretraining=True).train_flops(
        LENGTH, BATCH, round(0.15 * (LENGTH - 1)) * BATCH)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bodies", nargs="+", default=["bert", "deberta", "modern"])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--finetune-updates", type=int, default=900)
    p.add_argument("--workdir", type=Path, default=REPO / "work_dirs" / "bodies")
    p.add_argument("--demo-workdir", type=Path, default=REPO / "work_dirs" / "demo")
    p.add_argument("--results", type=Path, default=REPO / "examples" / "bodies" / "results")
    args = p.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    data = prepare_corpus(str(args.demo_workdir))
    sentiment = prepare_sentiment(str(args.demo_workdir), data)
    vocab = len(Dictionary.load(os.path.join(data, "dict.txt"))) + 1
    budget = MAIN_JOB_UPDATES * flops_per_update("bert", vocab)

    runs, starts = [], []
    for body in args.bodies:
        per_update = flops_per_update(body, vocab)
        updates = math.floor(budget / per_update)
        save_dir, log = args.workdir / body, args.workdir / f"{body}.log"
        if not (log.exists() and "done training" in log.read_text()):
            cmd = preset_cmd(data, save_dir, updates, args.seeds[0], log, "small_compute",
                             args.workdir / "hydra" / body, CONFIG_DIR)
            cmd += [f"+model.encoder_body={body}", "checkpoint.save_interval_updates=0",
                    "checkpoint.no_epoch_checkpoints=true"]
            print(" ".join(map(str, cmd)), flush=True)
            subprocess.run([str(c) for c in cmd], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        lines = log.read_text().splitlines()
        valid = [line for line in lines if "valid on 'valid' subset" in line]
        wall = [line for line in lines if "done training in" in line]
        runs.append(dict(body=body, updates=updates, flops_per_update=per_update,
                         flops=updates * per_update, last_valid=valid[-1] if valid else "",
                         done=wall[-1] if wall else ""))
        print(runs[-1], flush=True)
        starts.append(trials.from_checkpoint(str(save_dir / "checkpoint_last.pt"), body))

    task = trials.parse_task(f"SST-2={sentiment}")
    planned = [t for start in starts for t in trials.plan(
        [task], start, args.seeds, str(args.workdir / "finetune"), start.label)]
    recipe = trials.Recipe(lr=3e-4, layer_decay=1.0, max_update=args.finetune_updates,
                           cpu=True)
    results = trials.run_trials(planned, recipe, jobs=2)
    rows = report.report_rows(results)
    report.write_report(rows, results, str(args.results))
    (args.results / "results.json").write_text(json.dumps(dict(
        budget_flops=budget, runs=runs,
        trials=[dict(arm=r.arm, scores=r.scores) for r in rows]), indent=1))
    print((args.results / "trials.md").read_text() if (args.results / "trials.md").exists()
          else rows)


if __name__ == "__main__":
    sys.exit(main())
