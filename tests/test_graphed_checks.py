"""--graphed-step never changes silently under a run: the default backend (inductor)
compiles the whole step on a CPU, reaching dynamo's recompile limit is one line naming the
cause and the fix, and a model changed after the capture is refused."""

import shutil

import pytest
import torch

from electra_plugin.data.masking import max_predictions, prediction_slots
from electra_plugin.speed import compile as graphed
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import masked_batch, records, run, tiny_model, train_cmd
from test_compile import counters_of, graphed_run

pytestmark = pytest.mark.slow  # each test compiles a step (dynamo: seconds on 2 cores)


def step(model, task, length):
    src, target, _, picked = masked_batch(task, length=length)
    positions, weights = prediction_slots(picked, max_predictions(0.15, length))
    return model(src, target=target, masked_positions=positions, masked_weights=weights,
                 has_padding=True)


def graphed_model():
    """One layer each: what is checked is the compiled step's guards, at any depth, and
    tracing costs time per layer."""
    model, task = tiny_model(dropout=0.0, attention_dropout=0.0, temperature=0.0, num_layers=1)
    assert graphed.compile_step(model, "aot_eager")
    return model, task


def test_the_recompile_limit_is_one_line_naming_the_lengths():
    model, task = graphed_model()
    with torch._dynamo.config.patch(recompile_limit=1), \
            pytest.raises(ElectraUsageError, match=r"more than 1 kinds of batch, dynamo's "
                                                   r"recompile limit .*lengths seen: \[20, 24\]"
                                                   r"\).*--tokens-per-sample") as error:
        step(model, task, 20)
        step(model, task, 24)
    assert "\n" not in str(error.value)


def test_a_model_changed_after_the_capture_is_refused(monkeypatch):
    monkeypatch.setattr(graphed, "CHECK_EVERY", 2)
    model, task = graphed_model()
    step(model, task, 20)  # captured
    step(model, task, 20)  # checked: the same model
    step(model, task, 20)
    model.discriminator.embeddings.register_forward_hook(lambda *args: None)
    with pytest.raises(ElectraUsageError, match="hooks changed after its step was captured"):
        step(model, task, 20)


@pytest.mark.skipif(shutil.which("g++") is None, reason="inductor on CPU needs a C++ compiler")
def test_inductor_compiles_the_whole_step_on_a_cpu(data_bin, tmp_path):
    """The default backend, with the gradients inside its one graph (a GPU run takes two):
    one graph, no break, the eager step's losses. Without dropout the step's one random draw
    is the generator's sampling, which inductor's ``fallback_random`` takes from torch's
    generator as eager does; the suite's strict mode makes a fall-back an error. One layer
    each, as inductor's compile time grows with the depth and its code for a layer is the
    same at any depth. inductor's C++ wrapper (``cpp_wrapper``) puts the graph's kernels in
    a few files, where the Python wrapper compiles each of its 44 apart: the same kernels,
    41 busy core-seconds on a fresh machine instead of 66 (docs/testing.md)."""
    extra = ("--max-update", "3", "--disable-validation", "--sample-break-mode", "none",
             "--dropout", "0", "--attention-dropout", "0", "--num-layers", "1")
    cmd = graphed_run(data_bin, tmp_path / "graphed", *extra, backend="inductor")
    cmd[2] = "import torch._inductor.config as c; c.fallback_random = True; " \
        "c.cpp_wrapper = True; " + cmd[2]
    done = run(cmd)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "one compiled graph (inductor, gradients inside)" in done.stdout + done.stderr
    counters = counters_of(done.stdout)
    assert counters["stats"]["unique_graphs"] == 1, counters
    assert not counters.get("graph_break") and not counters.get("recompiles"), counters
    eager = run(train_cmd(data_bin, tmp_path / "eager", "--no-epoch-checkpoints", *extra))
    assert eager.returncode == 0, eager.stderr[-3000:]
    for a, b in zip(records(done.stdout), records(eager.stdout), strict=True):
        for key in ("loss", "disc_loss", "gen_loss", "gnorm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-3), key
