"""--torch-compile: the compiled encoders compute what the eager ones do, and batches of
other sizes, lengths and masked counts reuse the graphs instead of recompiling."""

import functools
import json
import shutil
import sys

import pytest
import torch

from electra_plugin.models.core.contract import BatchLayout
from electra_plugin.speed import compile_encoders
from helpers import (assert_metrics_equal, assert_same_params, checkpoint, ddp_train, free_port,
                     masked_batch, records, run, run_together, tiny_model, train, train_cmd)

# one layer per encoder in the compiled runs: dynamo traces each layer anew (compile time
# grows with the depth), and a layer's graph is the same at any depth
ONE_LAYER = ("--num-layers", "1")
# fairseq-train in a process that prints torch.compile's counters when the run is over
COUNTING_TRAIN = ("import json, sys; from fairseq_cli import train; train.cli_main(); "
                  "from torch._dynamo.utils import counters; "
                  "print('COUNTERS', json.dumps({k: dict(v) for k, v in counters.items()}))")


def encode_and_grads(model, src, device):
    model.to(device)
    hidden, _ = model.discriminator.encode(src.to(device), BatchLayout(src.eq(1).to(device)))
    # a loss the last LayerNorm does not absorb (a sum of squares would leave rounding noise)
    weights = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(0))
    (hidden * weights.to(device)).sum().backward()
    return hidden.detach().cpu(), [p.grad.cpu() for p in model.discriminator.parameters()]


def assert_compiled_matches_eager(device, backend):
    (eager, task), (compiled, _) = (tiny_model(dropout=0.0, attention_dropout=0.0)
                                    for _ in range(2))
    assert compile_encoders(compiled, backend)
    src = masked_batch(task)[0]  # with a padded row: the masked attention graph
    (h_eager, g_eager), (h_compiled, g_compiled) = (encode_and_grads(m, src, device)
                                                    for m in (eager, compiled))
    torch.testing.assert_close(h_compiled, h_eager, rtol=1e-5, atol=1e-5)
    # fp32 sums in another order; gradients that are 0 in exact arithmetic (the key bias)
    # are rounding noise in both, judged against the largest gradient
    scale = max(g.abs().max().item() for g in g_eager)
    for a, b in zip(g_compiled, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * scale)


@pytest.mark.slow
def test_compiled_encoder_matches_eager_on_cpu():
    """aot_eager: dynamo's symbolic trace of ``encode`` with and without the attention mask;
    inductor's CPU code for the same layers is held to the eager step in
    tests/test_graphed_checks.py (whole step), its GPU code below."""
    assert_compiled_matches_eager("cpu", "aot_eager")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_encoder_matches_eager_on_gpu():
    assert_compiled_matches_eager("cuda", "inductor")


def float_inputs(graph) -> list:
    """The graph's inputs that are Python floats dynamo wrapped as 0-d tensors."""
    return [node.name for node in graph.graph.nodes if node.op == "placeholder"
            and isinstance(value := node.meta["example_value"], torch.Tensor)
            and value.dim() == 0 and value.dtype == torch.float64]


@pytest.mark.slow
def test_the_compiled_encoders_take_the_modules_floats_as_constants(monkeypatch):
    """The floats part: the dropout rates and epsilons are constants of the encoder's graph;
    with it off (dynamo's own dynamic=True) each is an input of the graph, traced as a
    symbol with its guards (docs/benchmarks.md, "Compile time")."""
    graphs = []

    def record(graph, example_inputs):  # a backend that keeps the graph and runs it as traced
        graphs.append(graph)
        return graph.forward

    torch._dynamo.register_backend(record, name="record_encoder_graph")
    for speed in ("1", "-floats"):
        monkeypatch.setenv("ELECTRA_SPEED", speed)
        model, task = tiny_model(num_layers=1)
        assert compile_encoders(model, "record_encoder_graph")
        src = masked_batch(task)[0]
        with torch.no_grad():
            model.discriminator.encode(src, BatchLayout(src.eq(1)))
    (constant, symbolic) = graphs
    assert float_inputs(constant) == [], float_inputs(constant)
    assert any(name.endswith("dropout_p") for name in float_inputs(symbolic)) and \
        any(name.endswith("eps") for name in float_inputs(symbolic)), float_inputs(symbolic)


@pytest.mark.slow
def test_a_run_compiles_each_encoder_once_per_mask_kind(data_bin, tmp_path):
    """Sentence-sized samples: every batch has its own length, padding and masked count."""
    cmd = train_cmd(data_bin, tmp_path, "--max-update", "8", "--no-save",
                    "--disable-validation", "--sample-break-mode", "complete",
                    "--batch-size", "5", "--torch-compile", "aot_eager", *ONE_LAYER)
    result = run([sys.executable, "-c", COUNTING_TRAIN, *cmd[3:]])
    assert result.returncode == 0, result.stderr[-3000:]
    logs = records(result.stdout)
    assert [r["num_updates"] for r in logs] == list(range(1, 9))
    assert len({r["wpb"] for r in logs}) >= 5  # batches of different sizes
    counters = json.loads(result.stdout.split("COUNTERS ", 1)[1].splitlines()[0])
    # two encoders, each with or without an attention mask at most; no recompiles
    assert 2 <= counters["stats"]["unique_graphs"] <= 4, counters
    assert not counters.get("recompiles"), counters
    assert "--torch-compile aot_eager" in result.stdout + result.stderr


def graphed_run(data, save, *extra, backend="aot_eager"):
    """A train_cmd with --graphed-step (aot_eager: the whole-step capture, no code
    generation) that prints torch.compile's counters when the run is over."""
    cmd = train_cmd(data, save, "--graphed-step", "--torch-compile", backend,
                    "--no-epoch-checkpoints", *extra)
    return [sys.executable, "-c", COUNTING_TRAIN, *cmd[3:]]


def counters_of(stdout):
    return json.loads(stdout.split("COUNTERS ", 1)[1].splitlines()[0])


@pytest.mark.slow
def test_the_graphed_step_is_one_graph_equal_to_the_eager_step_and_resumes_exactly(data_bin,
                                                                                   tmp_path):
    """--graphed-step over a real run's batches (the epoch's short last batch included): one
    graph, no graph break, no recompile; losses and weights equal to the eager step's, with
    dropout (both draw F.dropout's masks from torch's generator: ELECTRA_SPEED=-dropout); and
    the run resumed from its checkpoint at update 2 (mid-epoch) ends weight for weight equal
    to it."""
    env = {"ELECTRA_SPEED": "-dropout"}
    # the tiny valid split: 80 sentences of --batch-size 8 over --tokens-per-sample 32
    # blocks, 3 updates an epoch, leaves a short last batch; a checkpoint every 2 updates.
    # Validated at each checkpoint and each epoch's end: eval runs the eager step, no second
    # graph. (Validating the subset it trains on, fairseq sets the shared dataset's epoch to
    # 1, so the masks of the rest of a later epoch differ: the eager run validates alike.)
    extra = ("--train-subset", "valid", "--save-interval-updates", "2", *ONE_LAYER)
    graphed = run(graphed_run(data_bin, tmp_path / "graphed", *extra, "--max-update", "8"),
                  env=env)
    assert graphed.returncode == 0, graphed.stderr[-3000:]
    assert "the step runs as one compiled graph (aot_eager, gradients inside)" in \
        graphed.stdout + graphed.stderr
    counters = counters_of(graphed.stdout)
    assert counters["stats"]["unique_graphs"] == 1, counters
    assert not counters.get("graph_break") and not counters.get("recompiles"), counters
    eager = run(train_cmd(data_bin, tmp_path / "eager", "--no-epoch-checkpoints", *extra,
                          "--max-update", "8"), env=env)
    assert eager.returncode == 0, eager.stderr[-3000:]
    logged = [records(p.stdout) for p in (graphed, eager)]
    assert [r["num_updates"] for r in logged[0]] == [r["num_updates"] for r in logged[1]]
    assert records(graphed.stdout, tag="valid"), "no validation ran"
    epochs = [r.get("epoch") for r in logged[0]]
    assert len(set(epochs)) > 1, "the run did not cross an epoch's short last batch"
    for a, b in zip(*logged):
        for key in ("loss", "disc_loss", "gen_loss", "disc_acc", "gnorm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-3), key
    weights = [torch.load(tmp_path / name / "checkpoint_last.pt", weights_only=False)["model"]
               for name in ("graphed", "eager")]
    for name, tensor in weights[1].items():
        torch.testing.assert_close(weights[0][name], tensor, rtol=1e-4, atol=1e-5)
    (tmp_path / "resumed").mkdir()
    shutil.copy(tmp_path / "graphed" / "checkpoint_1_2.pt",
                tmp_path / "resumed" / "checkpoint_last.pt")
    rest = run(graphed_run(data_bin, tmp_path / "resumed", *extra, "--max-update", "8"), env=env)
    assert rest.returncode == 0 and "Loaded checkpoint" in rest.stdout + rest.stderr, \
        rest.stderr[-3000:]
    assert [r["num_updates"] for r in records(rest.stdout)] == [3, 4, 5, 6, 7, 8]
    resumed = torch.load(tmp_path / "resumed" / "checkpoint_last.pt", weights_only=False)["model"]
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, resumed[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("strict", [False, True], ids=["warns", "strict"])
def test_a_step_that_cannot_compile_whole_runs_eager_with_one_line(strict, caplog,
                                                                   monkeypatch):
    """A step that branches on its data on the host (here a check of one's own on the
    embeddings' input: an if on the tokens' values) cannot be one graph: the first batch
    says so in one warning and the step runs eager, equal to the plain step; with
    ELECTRA_GRAPHED_STRICT=1 (as the suite runs) it is an error naming the cause."""
    from electra_plugin.data.masking import max_predictions, prediction_slots
    from electra_plugin.speed.compile import STRICT, compile_step
    from electra_plugin.user_io.errors import ElectraUsageError

    monkeypatch.setenv(STRICT, "1" if strict else "0")
    (plain, task), (graphed, _) = (tiny_model(dropout=0.0, attention_dropout=0.0,
                                              temperature=0.0, num_layers=1) for _ in range(2))

    def check(module, args):
        if (args[0] >= len(task.dictionary)).any():
            raise ValueError("a token id outside the dictionary")

    graphed.discriminator.embeddings.register_forward_pre_hook(check)
    src, target, _, picked = masked_batch(task)
    positions, weights = prediction_slots(picked, max_predictions(0.15, src.size(1)))
    assert compile_step(graphed, "aot_eager")
    if strict:
        with pytest.raises(ElectraUsageError, match="cannot be compiled whole .*refuses"):
            graphed(src, target=target, masked_positions=positions, masked_weights=weights,
                    has_padding=True)
        return
    with caplog.at_level("WARNING"):
        outs = [m(src, target=target, masked_positions=positions, masked_weights=weights,
                  has_padding=True) for m in (graphed, plain)]
    lines = [r.getMessage() for r in caplog.records if "--graphed-step" in r.getMessage()]
    assert len(lines) == 1 and "runs eager" in lines[0] and "\n" not in lines[0], lines
    torch.testing.assert_close(outs[0].main_loss, outs[1].main_loss)


@pytest.mark.slow
@pytest.mark.parametrize("generator", ["fast_electra", "two_stage"])
def test_generators_with_a_schedule_run_graphed_like_eager(generator, data_bin, tmp_path):
    """Fast-ELECTRA's decaying temperature (a tensor the graph reads, then the final value)
    and two-stage training's switch (a stage the host reads before the step) take two graphs
    over a run, with no graph break; the run logs what the eager step's run logs (dropout
    from torch's generator, as above)."""
    env = {"ELECTRA_SPEED": "-dropout"}
    if generator == "fast_electra":
        mlm = run(train_cmd(data_bin, tmp_path / "mlm", "--objective", "mlm", "--max-update",
                            "2", "--disable-validation", "--no-epoch-checkpoints", *ONE_LAYER),
                  env=env)
        assert mlm.returncode == 0, mlm.stderr[-3000:]
        options = ["--generator", "fast_electra", "--generator-checkpoint",
                   str(tmp_path / "mlm" / "checkpoint_last.pt"), "--temperature-start", "2",
                   "--temperature-decay-updates", "4"]
    else:
        options = ["--generator", "two_stage", "--two-stage-updates", "3"]
    options += ["--max-update", "6", "--disable-validation", "--log-interval", "2", *ONE_LAYER]
    graphed = run(graphed_run(data_bin, tmp_path / "graphed", *options), env=env)
    assert graphed.returncode == 0, graphed.stderr[-3000:]
    assert "runs eager" not in graphed.stdout + graphed.stderr
    counters = counters_of(graphed.stdout)
    assert counters["stats"]["unique_graphs"] == 2, counters
    assert not counters.get("graph_break"), counters
    eager = run(train_cmd(data_bin, tmp_path / "eager", "--no-epoch-checkpoints", *options),
                env=env)
    assert eager.returncode == 0, eager.stderr[-3000:]
    logged = [records(p.stdout) for p in (graphed, eager)]
    assert [r["num_updates"] for r in logged[0]] == [r["num_updates"] for r in logged[1]]
    for a, b in zip(*logged):
        assert a.get("gen_temperature") == b.get("gen_temperature")
        assert {"loss", "gnorm"} <= b.keys()
        for key in ("loss", "disc_loss", "gen_loss", "disc_acc", "gnorm"):
            assert (key in a) == (key in b), key
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-3), key


def weighted(out):
    """The electra criterion's rule with its default weights (50, 1)."""
    return 50.0 * out.main_loss + out.generator_loss


def twin_models():
    """Two deterministic tiny models with the same weights, the second's step compiled
    whole (aot_eager), their task and a batch: (plain, graphed, task, batch)."""
    from electra_plugin.data.masking import max_predictions, prediction_slots
    from electra_plugin.speed.compile import compile_step

    (plain, task), (graphed, _) = (tiny_model(dropout=0.0, attention_dropout=0.0,
                                              temperature=0.0, num_layers=1) for _ in range(2))
    graphed.load_state_dict(plain.state_dict())
    src, target, _, picked = masked_batch(task)
    positions, weights = prediction_slots(picked, max_predictions(0.15, src.size(1)))
    assert compile_step(graphed, "aot_eager")
    return plain, graphed, task, (src, target, positions, weights)


def assert_taken_by_the_graph(graphed, eager, taken):
    """``taken`` (loss, gradients), from ``graphed``'s graph, equal ``eager``'s from
    autograd within fp32 rounding; -> the largest gradient."""
    (loss, grads), (graphed_loss, graphed_grads) = eager, taken
    assert graphed.electra_step.params is not None  # the gradients came from the graph
    torch.testing.assert_close(graphed_loss, loss)
    top = max(g.abs().max() for g in grads.values())
    for name, grad in grads.items():
        torch.testing.assert_close(graphed_grads[name], grad, rtol=1e-5, atol=1e-6 * top)
    return top


def step_gradients(model, batch, autocast, scale=1.0, rule=weighted):
    """The loss of one step on ``batch`` by ``rule`` (the graph's own where the graph took
    the gradients, as the criterion takes it), backward times ``scale`` (fairseq's
    ignore_grad: 0): the loss and the gradients, added to any there."""
    src, target, positions, weights = batch
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(src, target=target, masked_positions=positions, masked_weights=weights,
                    has_padding=True)
        loss = rule(out) if out.loss is None else out.loss
    (loss * scale).backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("accumulates", [False, True], ids=["autograd", "own"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "autocast-bf16"])
def test_gradients_taken_inside_the_graph_are_autograds(autocast, accumulates):
    """--graphed-step with the criterion's loss weights takes the gradients inside its graph
    (one function of the parameters, torch.func): they equal autograd's through the eager
    step, under bf16 autocast too (its backward outside autocast, as autograd's); a second
    backward adds to them (--update-freq) and a zero cotangent (ignore_grad) adds nothing,
    whether autograd's accumulation hands them to the parameters or the step itself does
    (no DDP wrapper). A parameter registered in two modules leaves the gradients to
    autograd."""
    from electra_plugin.speed.compile import tied_across_modules

    plain, graphed, _, batch = twin_models()
    graphed.electra_step.combine = weighted
    graphed.electra_step.accumulates = accumulates
    plain.train(), graphed.train()
    (_, grads), taken = (step_gradients(m, batch, autocast) for m in (plain, graphed))
    top = assert_taken_by_the_graph(graphed, (_, grads), taken)
    _, twice = step_gradients(graphed, batch, autocast)
    _, still = step_gradients(graphed, batch, autocast, scale=0.0)
    for name, grad in grads.items():
        torch.testing.assert_close(twice[name], 2 * grad, rtol=1e-5, atol=2e-6 * top)
        assert torch.equal(still[name], twice[name]), name

    shared = torch.nn.Linear(2, 2)
    assert not tied_across_modules(torch.nn.Sequential(shared, shared))  # one module
    other = torch.nn.Linear(2, 2)
    other.weight = shared.weight
    assert tied_across_modules(torch.nn.Sequential(shared, other))


@pytest.mark.slow
def test_the_graph_takes_the_gradients_of_the_criterions_own_rule():
    """The graph calls the rule the criterion gives it (ElectraCriterion.combine): another
    weight and a term of its own, as a criterion of one's own might add, and the graph's
    gradients follow autograd's through the eager step (a copy of the default rule inside
    the graph would not)."""
    from electra_plugin.criterions.electra import ElectraCriterion

    class Squared(ElectraCriterion):
        def combine(self, model, out):
            return super().combine(model, out) + 0.3 * out.generator_loss ** 2

    plain, graphed, task, batch = twin_models()
    criterion = Squared(task, disc_weight=7.0, gen_weight=2.0)
    graphed.electra_step.combine = functools.partial(criterion.combine, graphed)
    plain.train(), graphed.train()
    (loss, grads), taken = (
        step_gradients(m, batch, False, rule=functools.partial(criterion.combine, m))
        for m in (plain, graphed))
    assert_taken_by_the_graph(graphed, (loss, grads), taken)
    default = step_gradients(plain, batch, False, rule=weighted)[1]  # (added to the first)
    assert any(not torch.allclose(default[n] - grads[n], grads[n], rtol=1e-3) for n in grads)


@pytest.mark.slow
def test_the_graphed_steps_gradients_reduce_across_workers_like_update_freq_2(
        data_bin, tmp_path):
    """Two CPU workers (fairseq's legacy DDP), each taking its gradients inside the graph:
    the run equals one process's eager step with --update-freq 2."""
    deterministic = ("--temperature", "0", "--dropout", "0", "--attention-dropout", "0",
                     "--max-update", "3", "--disable-validation", "--no-epoch-checkpoints",
                     *ONE_LAYER)
    single = train(data_bin, tmp_path / "freq2", "--update-freq", "2", *deterministic)
    outputs = ddp_train(data_bin, tmp_path / "ddp", "--graphed-step", "--torch-compile",
                        "aot_eager", *deterministic)
    assert "one compiled graph (aot_eager, gradients inside)" in "".join(outputs[0])  # rank 0 logs
    assert_metrics_equal(records(single), records(outputs[0][0]), "update-freq 2 vs 2 workers")
    assert_same_params(checkpoint(tmp_path / "freq2" / "checkpoint_last.pt")["model"],
                       checkpoint(tmp_path / "ddp" / "checkpoint_last.pt")["model"], atol=1e-5,
                       what="update-freq 2 vs 2 graphed workers")


# one rank of torch's DDP (gloo) around the graphed step: two backwards, rank 0 saves grads
TORCH_DDP_RANK = """
import sys, torch, torch.distributed as dist
sys.path.insert(0, {tests!r})
from helpers import masked_batch, tiny_model
from electra_plugin.data.masking import max_predictions, prediction_slots
from electra_plugin.speed.compile import compile_step
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2)
model, task = tiny_model(dropout=0.0, attention_dropout=0.0, temperature=0.0, num_layers=1)
assert compile_step(model, "aot_eager")
model.electra_step.combine = lambda out: 50.0 * out.main_loss + out.generator_loss
ddp = torch.nn.parallel.DistributedDataParallel(model)
src, target, _, picked = masked_batch(task, seed=rank)
positions, weights = prediction_slots(picked, max_predictions(0.15, src.size(1)))
for _ in range(2):  # the reducer must be ready again for the second backward
    out = ddp(src, target=target, masked_positions=positions, masked_weights=weights,
              has_padding=True)
    out.loss.backward()  # the loss the graph took the gradients of
assert model.electra_step.params is not None  # the graph took the gradients
if rank == 0:
    torch.save({{n: p.grad for n, p in model.named_parameters()}}, {saved!r})
"""


@pytest.mark.slow
def test_torch_ddp_reduces_the_graphs_gradients_from_its_hooks(tmp_path):
    """torch's DistributedDataParallel (fairseq's c10d; on GPUs only in fairseq) all-reduces
    from the hooks autograd's accumulation fires: with the gradients handed over from the
    graph, each worker holds the mean of the two workers' eager gradients (twice: two
    backwards without a step accumulate)."""
    from pathlib import Path

    from electra_plugin.data.masking import max_predictions, prediction_slots

    saved = tmp_path / "grads.pt"
    code = TORCH_DDP_RANK.format(tests=str(Path(__file__).parent), port=free_port(),
                                 saved=str(saved))
    results = run_together([[sys.executable, "-c", code, str(rank)] for rank in range(2)])
    assert all(c == 0 for c, _, _ in results), [err[-3000:] for _, _, err in results]
    total = {}
    for seed in range(2):
        plain, task = tiny_model(dropout=0.0, attention_dropout=0.0, temperature=0.0,
                                 num_layers=1)
        src, target, _, picked = masked_batch(task, seed=seed)
        positions, weights = prediction_slots(picked, max_predictions(0.15, src.size(1)))
        _, grads = step_gradients(plain, (src, target, positions, weights), False)
        for name, grad in grads.items():
            total[name] = total.get(name, 0) + grad  # the mean of two backwards by two workers
    reduced = torch.load(saved)
    top = max(g.abs().max() for g in total.values())
    for name, grad in total.items():
        torch.testing.assert_close(reduced[name], grad, rtol=1e-5, atol=1e-6 * top)


def test_gradients_the_step_adds_take_the_parameters_layout():
    """Where the step adds its gradients itself, a first gradient in another layout than its
    parameter's is copied into the parameter's (as autograd's accumulation does: the fused
    Adam kernel reads the two as one); a second one is added to it."""
    from electra_plugin.speed.compile import accumulate

    p = torch.nn.Parameter(torch.zeros(3, 4))
    transposed = torch.arange(12.0).reshape(4, 3).t()  # 3 x 4, column-major
    accumulate([p], [transposed])
    assert p.grad.stride() == p.stride() and torch.equal(p.grad, transposed)
    same = torch.ones(3, 4)
    q = torch.nn.Parameter(torch.zeros(3, 4))
    accumulate([q], [same])
    assert q.grad is same  # in the parameter's layout already: taken as it is
    accumulate([p, q], [transposed, same])
    assert torch.equal(p.grad, 2 * transposed) and torch.equal(q.grad, 2 * torch.ones(3, 4))


@pytest.mark.slow
@pytest.mark.parametrize("guards", ["values", "all"])
def test_the_graphed_step_keeps_its_guards_on_values(guards, monkeypatch):
    """The graph drops dynamo's guards on the model's structure (fixed when the step takes
    its parameters at the first batch) and keeps those on the values the step reads: the
    tensors' and the numbers' and flags' (a module put in eval mode recompiles);
    ELECTRA_SPEED=-guards keeps them all. Either way the step equals the eager one."""
    from torch._dynamo.utils import counters

    from electra_plugin.data.masking import max_predictions, prediction_slots
    from electra_plugin.speed import compile as compile_module

    if guards == "all":
        monkeypatch.setenv("ELECTRA_SPEED", "-guards")
    seen, original = [], compile_module.unguarded_structure

    def recording(entries):
        keep = original(entries)
        seen.extend(zip(entries, keep))
        return keep

    monkeypatch.setattr(compile_module, "unguarded_structure", recording)
    (plain, task), (graphed, _) = (tiny_model(dropout=0.0, attention_dropout=0.0,
                                              temperature=0.0, num_layers=1) for _ in range(2))
    graphed.load_state_dict(plain.state_dict())
    src, target, _, picked = masked_batch(task)
    positions, weights = prediction_slots(picked, max_predictions(0.15, src.size(1)))
    assert compile_module.compile_step(graphed, "aot_eager")
    graphed.electra_step.combine = weighted

    def graphs_after_step():
        losses = [m(src, target=target, masked_positions=positions, masked_weights=weights,
                    has_padding=True).main_loss for m in (graphed, plain)]
        torch.testing.assert_close(losses[0], losses[1])
        return counters["stats"]["unique_graphs"]

    plain.train(), graphed.train()
    first = graphs_after_step()
    for m in (graphed, plain):
        m.generator.eval()  # a value the step reads: the generator's dropout off
    assert graphs_after_step() == first + 1
    if guards == "all":
        assert not seen
        return
    dropped = [entry for entry, keep in seen if not keep]
    assert len(dropped) > len(seen) / 4, (len(dropped), len(seen))
    assert all(e.guard_type in compile_module.STRUCTURE and e.name.startswith("self")
               for e in dropped)
    assert {"TENSOR_MATCH", "CONSTANT_MATCH"} <= {e.guard_type for e, keep in seen if keep}


def test_the_fall_back_line_names_an_exception_without_a_message():
    """The compiler's errors reach the fall-back's one line by their message's first line;
    one with no message at all (torch 2.11's bare AssertionError) by its class."""
    from electra_plugin.speed.compile import first_line

    assert first_line(AssertionError()) == "AssertionError"
    assert first_line(RuntimeError("  \n")) == "RuntimeError"
    assert first_line(ValueError("a token id outside\nthe dictionary")) == \
        "a token id outside"


def test_the_graph_reads_the_steps_output_through_its_declared_fields():
    """The graph with the gradients inside returns the output's TRAINING_FIELDS and fills
    FILLED_BY_THE_GRAPH: the model's output declares both among its fields, and an output
    where one is renamed is refused by name before anything is traced."""
    import typing

    from electra_plugin.models.electra import ElectraModel
    from electra_plugin.models.objectives.base import PretrainingOutput
    from electra_plugin.speed.compile import declared_output

    output = typing.get_type_hints(ElectraModel.electra_step)["return"]
    assert declared_output(output) is PretrainingOutput
    assert "main_loss" in output.TRAINING_FIELDS and "loss" in output.FILLED_BY_THE_GRAPH

    class Renamed(typing.NamedTuple):
        disc_loss: torch.Tensor  # was main_loss
        generator_loss: torch.Tensor
        logs: dict
        positions: torch.Tensor
        masked_weights: torch.Tensor
        loss: torch.Tensor
        TRAINING_FIELDS = PretrainingOutput.TRAINING_FIELDS
        FILLED_BY_THE_GRAPH = PretrainingOutput.FILLED_BY_THE_GRAPH

    with pytest.raises(TypeError, match="missing: main_loss"):
        declared_output(Renamed)
    with pytest.raises(TypeError, match="the declarations"):
        declared_output(typing.NamedTuple("Undeclared", [("loss", torch.Tensor)]))
