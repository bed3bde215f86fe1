"""benchmarks/compile_time.py runs end to end: a graphed step's first update (or with
--encoders, the compiled encoders') in a fresh process, split into the compiler's phases as
dynamo times them."""

import json
import sys

import pytest

from forkserver import warm_python
from helpers import REPO, run


def compile_time(out, *options):
    """The benchmark at tiny sizes, its row's process forked warm (forkserver.warm_python):
    its compile as cold, without an interpreter's seconds of imports."""
    return run(
        [sys.executable, str(REPO / "benchmarks" / "compile_time.py"), "--arch", "electra_tiny",
         "--batch-size", "2", "--length", "16", "--vocab", "64", "--backends", "aot_eager",
         "--python", str(warm_python(out.parent)), "--json", str(out), *options,
         "--plugin-args", "--num-layers", "1"],
        cwd=REPO)


@pytest.mark.slow
def test_the_first_graphed_update_is_timed_and_split_by_phase(tmp_path):
    out = tmp_path / "compile.json"
    proc = compile_time(out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["row"] == "aot_eager" and row["graphs"] == 1 and not row["eager"], row
    # the first update compiles (dynamo traces, AOT autograd functionalizes), the next replays
    assert row["dynamo"] > 0 and row["aot autograd"] > 0, row
    assert row["inductor lowering"] == row["code generation"] == 0, row  # no inductor
    assert row["first_update_s"] > row["dynamo"] > row["next_update_s"], row
    assert "aot_eager | " in proc.stdout, proc.stdout


@pytest.mark.slow
def test_the_encoders_first_compiled_update_is_timed(tmp_path):
    """--encoders: --torch-compile alone, a graph per encoder (the generator's and the
    discriminator's; this batch has no padding, so one attention form each)."""
    out = tmp_path / "compile.json"
    proc = compile_time(out, "--encoders")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["graphs"] == 2 and row["dynamo"] > 0 and row["aot autograd"] > 0, row
    assert proc.stdout.startswith("encoders, electra_tiny 2 x 16"), proc.stdout
