#!/usr/bin/env python
"""How often a SIGKILL during a checkpoint save damages a file, fairseq's copy vs the plugin's.

Trains electra_small on a binarized corpus with a save every few updates and kills the run
at a random moment of a save (after fairseq logs "Preparing to save checkpoint"), then counts
the checkpoint files in --save-dir that no longer open (``checkpoint_damage``). ``stock``
runs the same command with fairseq's own ``PathManager.copy`` put back; ``plugin`` with the
plugin's atomic copy. Each kill is followed by a plain resume of the same command, as a user
would do it.

    python benchmarks/kill_during_save.py work_dirs/demo/data-bin --kills 10
"""

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RUNNER = """
import sys
import electra_plugin  # noqa: F401  (installs the crash-safety wrappers)
from fairseq.file_io import PathManager
if sys.argv.pop(1) == "stock":
    PathManager.copy = staticmethod(PathManager.copy.args[0])  # fairseq's own copy back
from fairseq_cli.train import cli_main
cli_main()
"""


def command(mode, data, save_dir):
    return [sys.executable, "-c", RUNNER, mode, str(data), "--user-dir", str(REPO / "electra_plugin"),
            "--task", "electra", "--criterion", "electra", "--arch", "electra_small", "--cpu",
            "--tokens-per-sample", "128", "--batch-size", "2", "--num-workers", "0",
            "--data-buffer-size", "0", "--optimizer", "electra_adam", "--lr", "1e-4",
            "--max-update", "1000", "--save-interval-updates", "2", "--no-epoch-checkpoints",
            "--disable-validation", "--save-dir", str(save_dir), "--log-format", "simple"]


def kill_during_save(cmd, delay):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    saves = 0
    for line in proc.stdout:
        if "Preparing to save checkpoint" in line:
            saves += 1
            if saves == 2:  # the first save of this run may be resuming's: take the second
                time.sleep(delay)
                proc.kill()
                break
    proc.wait()
    proc.stdout.close()


def main():
    from electra_plugin.models.core.checkpoint_file import checkpoint_damage

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="a binarized data directory (electra-prepare output)")
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--max-delay", type=float, default=0.6,
                   help="the kill comes 0..this many seconds after a save begins")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    for mode in ("stock", "plugin"):
        rng = random.Random(args.seed)
        damaged_last = damaged_any = 0
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.kills):
                save = Path(tmp) / "ck"
                kill_during_save(command(mode, args.data, save), rng.uniform(0, args.max_delay))
                bad = [p.name for p in save.glob("*.pt") if checkpoint_damage(p, thorough=True)]
                damaged_last += "checkpoint_last.pt" in bad
                damaged_any += bool(bad)
        print(f"{mode:6s}: {args.kills} kills during saves -> checkpoint_last.pt damaged "
              f"{damaged_last} times, some checkpoint damaged {damaged_any} times", flush=True)


if __name__ == "__main__":
    main()
