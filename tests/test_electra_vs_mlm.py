"""scripts/electra_vs_mlm.py, the paper's comparison, rehearsed on the CPU at tiny sizes as
benchmarks/gpu_session.sh's first stage runs it (TINY=1: the graphed step included), and
its refusals of bad input."""

import json
import os
import random
import subprocess
import sys

import pytest

from electra_plugin.cli import glue as glue_cli
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import REPO, sentence_task_rows

sys.path.insert(0, str(REPO / "scripts"))
import electra_vs_mlm  # noqa: E402  (a script, not a package module)


@pytest.mark.slow
def test_the_comparison_runs_as_the_gpu_session_stage_at_tiny_sizes(spm_data, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "data-bin").symlink_to(spm_data)
    for task, seed in (("sentiment", 0), ("amazon", 1)):  # the second task is optional
        raw = tmp_path / task
        raw.mkdir()
        for split, rows in sentence_task_rows(random.Random(seed), train=40, dev=16).items():
            (raw / f"{split}.tsv").write_text(rows)
        glue_cli.main(["preprocess", "--task", task, "--text-columns", "0", "--glue-dir",
                       str(raw), "--pretrain-data", str(spm_data), "--out-dir",
                       str(data / f"{task}-bin")])
    out = tmp_path / "out"
    env = dict(os.environ, TINY="1", STAGES="compare", OUT=str(out), DATA=str(data),
               PYTHON=sys.executable, OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", "benchmarks/gpu_session.sh", "900"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stages = (out / "stages.txt").read_text()
    assert "== compare " in stages and "rc=0 " in stages, stages + \
        (out / "compare.txt").read_text()[-3000:]
    compare = out / "compare"
    # both pre-trained arms at the same FLOPs (within about half an update of the masked
    # LM, which costs less per update), by the graphed step
    plan = json.loads((compare / "plan.json").read_text())
    arms = {arm: json.loads((compare / f"pretrain-{arm}.json").read_text())
            for arm in ("electra", "mlm")}
    assert plan["flops_per_update"]["mlm"] < plan["flops_per_update"]["electra"], plan
    assert arms["electra"]["updates"] == plan["electra_updates"] == 4
    assert arms["mlm"]["updates"] == plan["mlm_updates"] >= 4
    assert abs(arms["electra"]["flops"] - arms["mlm"]["flops"]) <= \
        0.6 * plan["flops_per_update"]["mlm"], arms
    for arm in arms.values():
        assert "task.graphed_step=true" in arm["command"], arm["command"]
    # every arm fine-tuned on both tasks with the same seed, and the table written
    for arm in ("electra", "mlm", "random-init"):
        results = json.loads((compare / f"finetune-{arm}.json").read_text())["results"]
        assert sorted((r["task"], r["seed"]) for r in results) == \
            [("amazon", 1), ("sentiment", 1)], results
    table = (compare / "comparison.md").read_text()
    for cell in ("| electra | 4 |", f"| mlm | {plan['mlm_updates']} |", "| amazon | mlm |",
                 "| sentiment | electra - mlm |", "| amazon | mlm - random init |"):
        assert cell in table, table


@pytest.mark.parametrize("args, said", [
    (["--updates", "0"], "--updates 0 must be at least 1"),
    (["--flops", "-1"], "--flops -1 must be more than 0"),
    (["--warmup", "1.5"], "--warmup 1.5 is not a fraction"),
    (["--override", "task.mask_prob"], "is not KEY=VALUE"),
    (["--pretrain-minutes", "0"], "--pretrain-minutes 0 must be more than 0"),
])
def test_bad_options_end_in_one_line_before_anything_runs(tmp_path, capsys, args, said):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit:
        electra_vs_mlm.main(["--data", str(tmp_path), "--task", f"sentiment={tmp_path}",
                             "--out", str(out), *args])
    assert exit.value.code == 2 and said in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("data, task, said", [
    ("empty", "spm", "lacks dict.txt"),  # not electra-prepare's output
    ("spm", "missing", "missing is not a directory"),
    ("spm", "spm", "is no task's data"),  # a pre-training corpus is no task
])
def test_data_that_is_not_prepared_is_refused_in_one_line(spm_data, tmp_path, data, task,
                                                          said):
    dirs = dict(empty=tmp_path / "empty", spm=spm_data, missing=tmp_path / "missing")
    dirs["empty"].mkdir()
    out = tmp_path / "out"
    with pytest.raises(ElectraUsageError, match=said):
        electra_vs_mlm.main(["--data", str(dirs[data]), "--task", f"sentiment={dirs[task]}",
                             "--out", str(out)])
    assert not out.exists()
