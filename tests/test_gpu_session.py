"""benchmarks/gpu_session.sh rehearsed on the CPU at tiny sizes (TINY=1): every stage a GPU
session runs after the comparison (tests/test_electra_vs_mlm.py: the host-work count, the eager, graphed and peer rows, the graphed
pre-training, the trials, the bodies) ends well, so that a lent GPU's minutes are never lost
to a typo, an option or an import."""

import json
import os
import subprocess
import sys

import pytest

from electra_plugin.cli import glue as glue_cli
from helpers import REPO, sentence_task_rows

pytestmark = pytest.mark.slow


def test_the_gpu_session_runs_end_to_end_at_tiny_sizes(spm_data, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "data-bin").symlink_to(spm_data)
    raw = tmp_path / "sentiment"
    raw.mkdir()
    for split, rows in sentence_task_rows(train=40, dev=16).items():
        (raw / f"{split}.tsv").write_text(rows)
    glue_cli.main(["preprocess", "--task", "sentiment", "--text-columns", "0", "--glue-dir",
                   str(raw), "--pretrain-data", str(spm_data), "--out-dir",
                   str(data / "sentiment-bin")])
    out = tmp_path / "out"
    stages = "count bench_small bench_base pretrain trials bench_bodies"
    env = dict(os.environ, TINY="1", STAGES=stages, OUT=str(out), DATA=str(data), PYTHON=sys.executable,
               OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", "benchmarks/gpu_session.sh", "1500"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stages = (out / "stages.txt").read_text()
    for stage in ("count", "bench_small", "bench_base", "pretrain", "trials--checkpoint",
                  "trials--arch", "bench_bodies"):
        assert f"== {stage} " in stages, stages
    assert "skipped" not in stages and stages.count("rc=0 ") == 7, stages
    count = (out / "count.txt").read_text()
    assert "plugin --graphed-step" in count and "peer" in count, count
    for row in json.loads((out / "bench_small.json").read_text())["rows"]:  # --profile
        assert row["device_busy_ms_per_update"] == 0 and row["top_host_ops"], row  # (a CPU)
    assert "--graphed-step: the step runs as one compiled graph" in \
        (out / "pretrain.txt").read_text()
    assert (out / "trials--checkpoint.md").is_file() and (out / "trials--arch.md").is_file()
