"""benchmarks/compile_time.py runs end to end: a graphed step's first update in a fresh
process, split into the compiler's phases as dynamo times them."""

import json
import sys

import pytest

from helpers import REPO, run


@pytest.mark.slow
def test_the_first_graphed_update_is_timed_and_split_by_phase(tmp_path):
    out = tmp_path / "compile.json"
    proc = run(
        [sys.executable, str(REPO / "benchmarks" / "compile_time.py"), "--arch", "electra_tiny",
         "--batch-size", "2", "--length", "16", "--vocab", "64", "--backends", "aot_eager",
         "--json", str(out), "--plugin-args", "--num-layers", "1"],
        cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["row"] == "aot_eager" and row["graphs"] == 1 and not row["eager"], row
    # the first update compiles (dynamo traces, AOT autograd functionalizes), the next replays
    assert row["dynamo"] > 0 and row["aot autograd"] > 0, row
    assert row["inductor lowering"] == row["code generation"] == 0, row  # no inductor
    assert row["first_update_s"] > row["dynamo"] > row["next_update_s"], row
    assert "aot_eager | " in proc.stdout, proc.stdout
