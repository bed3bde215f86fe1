"""scripts/electra_vs_mlm.py, the paper's comparison: arms stopped before their first update,
the pace read off a fairseq console, the table, and its refusals of bad input. The whole
stage at tiny sizes (both arms at once, a clock shorter than the compile, the fine-tuning of
every arm) runs in tests/test_gpu_session.py, as benchmarks/gpu_session.sh runs it."""

import datetime
import json
import sys

import pytest

from electra_plugin.user_io.errors import ElectraUsageError
from helpers import REPO, gpu_session_data

sys.path.insert(0, str(REPO / "scripts"))
import electra_vs_mlm  # noqa: E402  (a script, not a package module)


@pytest.mark.slow
def test_arms_stopped_before_their_first_update_count_zero_and_random_init_still_runs(
        spm_data, tmp_path):
    data = gpu_session_data(tmp_path, spm_data, ("sentiment",))
    out = tmp_path / "out"
    electra_vs_mlm.main(["--data", str(data / "data-bin"), "--task",
                         f"sentiment={data / 'sentiment-bin'}", "--out-dir", str(out), "--cpu",
                         "--arch", "electra_tiny", "--updates", "4", "--batch", "8",
                         "--length", "32", "--seeds", "1", "--finetune-updates", "1",
                         "--pretrain-minutes", "1", "--deadline-minutes", "0.01"])
    for arm in ("electra", "mlm"):
        record = json.loads((out / f"pretrain-{arm}.json").read_text())
        assert record["updates"] == 0 and record["checkpoint"] is None, record
        assert record["ended"].startswith("stopped at --deadline-minutes"), record
        assert not (out / f"finetune-{arm}.json").exists()
    results = json.loads((out / "finetune-random-init.json").read_text())["results"]
    assert [r["task"] for r in results] == ["sentiment"]
    table = (out / "comparison.md").read_text()
    assert "| electra | 0 (4) |" in table and "| sentiment | random init |" in table, table
    assert "not run |" in table and "electra - mlm" not in table, table


def console_line(at, text, logger="train_inner"):
    return f"[{at:%Y-%m-%d %H:%M:%S},{at.microsecond // 1000:03d}][{logger}][INFO] - {text}\n"


def test_the_pace_is_read_off_an_arms_console(tmp_path):
    """Start-up to fairseq's first batch, the compile (the first update: the time to the
    first train_inner line less the updates after it at the steady pace), tokens/s and
    FLOP/s between the first and last train_inner lines, and the FLOPs projected at the end
    of the clock."""
    t0 = datetime.datetime(2026, 11, 28, 18, 0, 0)
    second = datetime.timedelta(seconds=1)
    console = tmp_path / "pretrain-electra.out"
    console.write_text(
        console_line(t0 + 5 * second, "Start iterating over samples", "fairseq_cli.train") +
        console_line(t0 + 25 * second, "epoch 001:  10 / 96 loss=3.1, num_updates=10, wall=20")
        + console_line(t0 + 27 * second, "epoch 001:  20 / 96 loss=3.0, num_updates=20, "
                                         "wall=22"))
    arm = dict(name="electra", console=str(console), started=t0.timestamp(), planned=1000,
               per_update=1e9)
    figures = electra_vs_mlm.pace_figures(arm, 1e9, 256)
    # 0.2 s per update: 1280 tokens/s, 5e9 FLOP/s; the first update ended 9 updates before
    # the first line
    assert figures == dict(startup_s=5.0, compile_s=pytest.approx(18.2), updates=20,
                           tokens_per_s=1280, flops_per_s=pytest.approx(5e9))
    now = t0.timestamp() + 27
    line = electra_vs_mlm.pace_line(arm, figures, now, clock_end=now + 100)
    assert line.startswith("electra: update 20 of 1,000, start-up 5.0 s + compile 18.2 s, "
                           "1,280 tokens/s, 5e+09 FLOP/s, projected 5.2e+11 FLOPs (52% of")
    capped = electra_vs_mlm.pace_line(arm, figures, now, clock_end=now + 1000)
    assert "projected 1e+12 FLOPs (100% of the plan)" in capped
    console.write_text(console_line(t0 + 5 * second, "Start iterating over samples",
                                    "fairseq_cli.train"))
    waiting = electra_vs_mlm.pace_figures(arm, 1e9, 256)
    assert waiting["updates"] == 0 and waiting["compile_s"] is None, waiting
    assert electra_vs_mlm.pace_line(arm, waiting, t0.timestamp() + 40, None) == \
        "electra: no update yet, 40 s after its start (start-up 5 s, compiling since)"


def test_the_table_names_a_zero_update_arm_and_unequal_flops():
    record = dict(planned_updates=4, tokens=256, flops=2e9, fraction_of_target=0.5,
                  fraction_of_paper_point=2e9 / electra_vs_mlm.PAPER_POINT, startup_s=3.0,
                  compile_s=12.4, wall_s=20.0, tokens_per_s=None, ended="stopped by its clock")
    pretrained = {"electra": dict(record, updates=1),
                  "mlm": dict(record, updates=0, tokens=0, flops=0.0, fraction_of_target=0.0,
                              compile_s=None, ended="stopped at --deadline-minutes, before "
                                                    "an update")}
    args = electra_vs_mlm.parse_args(["--data", "d", "--task", "t=d", "--out-dir", "o"])
    table = electra_vs_mlm.comparison(args, pretrained, {}, 30.0)
    assert "| start-up s | compile s | process s |" in table, table
    assert "| electra | 1 (4) | 256 | 2e+09 | 50% | 0.00% | 3 | 12 | 20 |  | stopped by " \
           "its clock | not run |" in table, table
    assert "| mlm | 0 (4) | 0 | 0 | 0% |" in table and "| 3 |  | 20 |" in table, table
    assert "Unequal FLOPs: the arms reached electra 2e+09 and mlm 0 training FLOPs;" in table, table


@pytest.mark.parametrize("args, said", [
    (["--updates", "0"], "--updates 0 must be at least 1"),
    (["--flops", "-1"], "--flops -1 must be more than 0"),
    (["--warmup", "1.5"], "--warmup 1.5 is not a fraction"),
    (["--override", "task.mask_prob"], "is not KEY=VALUE"),
    (["--pretrain-minutes", "0"], "--pretrain-minutes 0 must be more than 0"),
    (["--deadline-minutes", "-1"], "--deadline-minutes -1 must be more than 0"),
    (["--compile-minutes", "-1"], "--compile-minutes -1 must be 0 or more"),
])
def test_bad_options_end_in_one_line_before_anything_runs(tmp_path, capsys, args, said):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit:
        electra_vs_mlm.main(["--data", str(tmp_path), "--task", f"sentiment={tmp_path}",
                             "--out-dir", str(out), *args])
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
                             "--out-dir", str(out)])
    assert not out.exists()
