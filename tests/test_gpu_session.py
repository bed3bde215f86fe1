"""benchmarks/gpu_session.sh rehearsed on the CPU at tiny sizes (TINY=1), every stage in one
run, two at a time: the comparison (scripts/electra_vs_mlm.py: both arms at once by the
graphed step, a clock shorter than their compile), the host-work count, the eager, graphed
and peer rows, the graphed pre-training, the trials and the bodies end well and write what
they should, so that a lent GPU's minutes are never lost to a typo, an option or an import."""

import json
import os
import subprocess
import tarfile

import pytest

from forkserver import warm_python
from helpers import REPO, gpu_session_data

pytestmark = pytest.mark.slow

STAGES = ("compare", "count", "bench_small", "bench_base", "pretrain", "trials--checkpoint",
          "trials--arch", "bench_bodies")


@pytest.fixture(scope="module")
def session(spm_data, tmp_path_factory):
    """The rehearsal's $OUT, every stage run (amazon-bin: the optional second task)."""
    root = tmp_path_factory.mktemp("gpu_session")
    data = gpu_session_data(root, spm_data, ("sentiment", "amazon"))
    carried = root / "carried"  # an earlier session's inductor cache, carried in the data
    carried.mkdir()
    (carried / "from-an-earlier-session").write_text("")
    with tarfile.open(data / "inductor-cache.tar.gz", "w:gz") as tar:
        tar.add(carried, arcname=".")
    out = root / "out"
    # the script's python commands forked warm (forkserver.warm_python): its stages' command
    # lines and imports as they are, without each interpreter's seconds of library imports
    env = dict(os.environ, TINY="1", OUT=str(out), BACK=str(root / "back"), DATA=str(data),
               PYTHON=str(warm_python(root)), OMP_NUM_THREADS="1")
    env.pop("STAGES", None)
    proc = subprocess.run(["bash", "benchmarks/gpu_session.sh", "1500"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_every_stage_ends_well_with_its_markers(session):
    stages = (session / "stages.txt").read_text()
    for stage in STAGES:
        assert f"== {stage} " in stages and f"   {stage}: rc=0 " in stages, \
            stages + (session / f"{stage}.txt").read_text()[-3000:]
    assert "skipped" not in stages and stages.count("rc=0 ") == len(STAGES), stages
    count = (session / "count.txt").read_text()
    assert "plugin --graphed-step" in count and "peer" in count, count
    rows = json.loads((session / "bench_small.json").read_text())["rows"]
    for row in rows:  # --profile
        assert row["device_busy_ms_per_update"] == 0 and row["top_host_ops"], row  # (a CPU)
    speeds = {row["impl"].split("ELECTRA_SPEED=")[-1] for row in rows if "SPEED=" in row["impl"]}
    assert speeds == {"-gradients", "+replay"}, rows  # the GPU's flags, rehearsed
    # the graphed pre-training compiled: on a CPU the whole update (speed/whole_update.py), on
    # a GPU the graphed step around fairseq's update
    assert "the whole update (each micro-batch's forward and backward, the clip, Adam) runs " \
        "as one compiled graph (aot_eager)" in (session / "pretrain.txt").read_text()
    assert (session / "trials--checkpoint.md").is_file() and \
        (session / "trials--arch.md").is_file()


def test_the_comparison_pretrains_both_arms_at_once_and_finetunes_what_they_reached(session):
    compare = session / "compare"
    # both arms planned to the same FLOPs (within half an update of the masked LM, which
    # costs less per update), run at once by the graphed step, each cut by a clock shorter
    # than its compile: one update each, the time to it measured
    plan = json.loads((compare / "plan.json").read_text())
    per_update, updates = plan["flops_per_update"], plan["updates"]
    assert per_update["mlm"] < per_update["electra"] and updates["electra"] == 4, plan
    assert abs(updates["mlm"] * per_update["mlm"] - plan["flops"]) <= 0.5 * per_update["mlm"]
    arms = {arm: json.loads((compare / f"pretrain-{arm}.json").read_text())
            for arm in ("electra", "mlm")}
    for name, arm in arms.items():
        assert "task.graphed_step=true" in arm["command"], arm["command"]
        assert arm["updates"] == 1 and arm["ended"] == "stopped by its clock", arm
        assert arm["flops"] == pytest.approx(per_update[name], rel=0.2), arm
        assert 0 < arm["startup_s"] and 0.6 < arm["compile_s"] < arm["wall_s"], arm
    assert max(a["started_at"] for a in arms.values()) < \
        min(a["started_at"] + a["wall_s"] for a in arms.values()), arms  # at once
    pace = (compare / "pace.txt").read_text().splitlines()
    assert pace[0].split()[2] == "plan:" and "pace for it:" in pace[1], pace
    for name in arms:
        assert any(f"{name}: update 1 of " in line and "compile" in line for line in pace), pace
    # every arm fine-tuned on both tasks with the same seed, and the table says what each
    # pre-trained arm reached, and that the FLOPs differ
    for arm in ("electra", "mlm", "random-init"):
        results = json.loads((compare / f"finetune-{arm}.json").read_text())["results"]
        assert sorted((r["task"], r["seed"]) for r in results) == \
            [("amazon", 1), ("sentiment", 1)], results
    table = (compare / "comparison.md").read_text()
    for cell in ("| electra | 1 (4) |", f"| mlm | 1 ({updates['mlm']}) |", "stopped by its clock",
                 "Unequal FLOPs", "| amazon | mlm |", "| sentiment | electra - mlm |",
                 "| amazon | mlm - random init |", "ELECTRA_SPEED=-gradients"):
        assert cell in table, table


def test_what_comes_back_is_two_files_the_results_and_the_compile_cache(session):
    """A lent machine returns at most 8 files of its $OUT (BACK here): the results come back
    packed in one (the comparison's arms' consoles and commands among them), rewritten after
    each stage, and the inductor cache (with what the carried one held) in another, for the
    next session to carry."""
    back = session.parent / "back"
    assert sorted(p.name for p in back.iterdir()) == ["inductor-cache.tar.gz", "results.tar.gz"]
    with tarfile.open(back / "results.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"./stages.txt", "./compare/comparison.md", "./bench_small.json",
            "./compare/pretrain-electra.out", "./compare/pretrain-mlm.out",
            "./compare/commands.log"} <= names, names
    assert not any(name.startswith("./scratch") for name in names), names
    with tarfile.open(back / "inductor-cache.tar.gz") as tar:
        assert "./from-an-earlier-session" in tar.getnames()
