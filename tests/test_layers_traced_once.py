"""ELECTRA_SPEED's ``layers`` part (speed/layers.py): the graphed step with autograd's backward
traces each kind of encoder layer once and calls its graph for every layer like it, computing
what the layers traced one by one compute; a graph that takes its own gradients (torch.func)
traces them one by one, as it must."""

import pytest
import torch

from electra_plugin.data.masking import max_predictions, prediction_slots
from electra_plugin.speed.compile import compile_step
from electra_plugin.speed.layers import FLAG, run_layer
from helpers import masked_batch, tiny_model

pytestmark = pytest.mark.slow
LAYERS = 3
GRAPHS = []  # what dynamo hands the recording backend


@torch._dynamo.register_backend(name="recording_aot_eager")
def recording_aot_eager(graph, example_inputs):
    GRAPHS.append(graph)
    return torch._dynamo.lookup_backend("aot_eager")(graph, example_inputs)


def regions(graph):
    """(calls of a nested compile region, distinct regions called) in ``graph``."""
    calls = [n for n in graph.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    return len(calls), len({n.args[1] for n in calls})  # (the region's identifier)


def weighted(out):
    return 50.0 * out.main_loss + out.generator_loss


def step(model, batch):
    """One training step's loss (the criterion's default weights) and gradients."""
    src, target, positions, weights = batch
    out = model(src, target=target, masked_positions=positions, masked_weights=weights,
                has_padding=True)
    loss = weighted(out) if out.loss is None else out.loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


def graphed_twin(gradients_inside=False, body="bert"):
    """A deterministic tiny model of LAYERS layers and its twin whose step is compiled whole
    by the recording backend (the graph takes its own gradients where asked); a batch."""
    (plain, task), (graphed, _) = (tiny_model(dropout=0.0, attention_dropout=0.0,
                                              temperature=0.0, num_layers=LAYERS,
                                              encoder_body=body)
                                   for _ in range(2))
    graphed.load_state_dict(plain.state_dict())
    src, target, _, picked = masked_batch(task)
    positions, slots = prediction_slots(picked, max_predictions(0.15, src.size(1)))
    assert compile_step(graphed, "recording_aot_eager")
    if gradients_inside:
        graphed.electra_step.combine = weighted
    plain.train(), graphed.train()
    GRAPHS.clear()
    return plain, graphed, (src, target, positions, slots)


@pytest.mark.parametrize("body", ["bert", "deberta"])
def test_the_graphed_step_traces_each_kind_of_layer_once_and_steps_as_eager(body, monkeypatch,
                                                                            caplog):
    """With autograd's backward (the graph without its gradients, ELECTRA_SPEED=-gradients'
    two graphs), said in its log line; and with the part off, no region."""
    monkeypatch.setenv("ELECTRA_GRAPHED_STRICT", "1")
    plain, graphed, batch = graphed_twin(body=body)
    with caplog.at_level("INFO", logger="electra_plugin.speed.compile"):
        (loss, grads), (graphed_loss, graphed_grads) = (step(m, batch) for m in (plain, graphed))
    assert "one compiled graph (recording_aot_eager, each kind of layer traced once)" in \
        caplog.text
    assert graphed.electra_step.params is None and len(GRAPHS) == 1
    calls, kinds = regions(GRAPHS[0])
    # every layer of both encoders through a region; the generator's layers (a quarter of
    # the width) and the discriminator's are two kinds
    assert calls == 2 * LAYERS and kinds == 2, (calls, kinds)
    torch.testing.assert_close(graphed_loss, loss)
    top = max(g.abs().max() for g in grads.values())
    assert graphed_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(graphed_grads[name], grad, rtol=1e-4, atol=1e-6 * top)

    monkeypatch.setenv("ELECTRA_SPEED", "-layers")  # the part off: each layer traced
    _, graphed, batch = graphed_twin(body=body)
    step(graphed, batch)
    assert regions(GRAPHS[0]) == (0, 0)


def test_a_graph_that_takes_its_own_gradients_traces_each_layer(monkeypatch):
    monkeypatch.setenv("ELECTRA_GRAPHED_STRICT", "1")  # a fall-back to eager fails
    _, graphed, batch = graphed_twin(gradients_inside=True)
    step(graphed, batch)
    assert graphed.electra_step.params is not None  # the gradients came from the graph
    assert regions(GRAPHS[0]) == (0, 0)


class Stack(torch.nn.Module):
    """Two dropout layers as an encoder's layers."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.ModuleList(torch.nn.Dropout(0.5) for _ in range(2))
        setattr(self, FLAG, True)

    def forward(self, x):
        return torch.stack([run_layer(self, layer, x) for layer in self.layer])


@pytest.mark.parametrize("device,backend", [
    ("cpu", "aot_eager"), ("cpu", "inductor"),
    pytest.param("cuda", "inductor", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_a_region_called_twice_draws_two_dropout_masks(device, backend):
    """The region's random numbers are drawn at each call: each layer has its own dropout
    mask, and the next step has new ones."""
    stack = Stack().to(device).train()
    compiled = torch.compile(stack, backend=backend, fullgraph=True)
    x = torch.ones(4096, device=device)
    first, second = compiled(x), compiled(x)
    for masks in (first, second):
        assert not torch.equal(masks[0], masks[1])
        kept = masks.ne(0).float().mean().item()
        assert 0.45 < kept < 0.55 and set(masks.unique().tolist()) == {0.0, 2.0}
    assert not torch.equal(first, second)
