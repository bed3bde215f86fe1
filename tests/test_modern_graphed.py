"""The modern body under --graphed-step: in a compiled graph its unpadded layers take static
rows (every position, the real tokens first: electra_plugin/speed/unpad.py), so the step
compiles whole, without nonzero or any host sync, and computes what the eager step's
nonzero rows compute; the eager step keeps those rows (the padding's work saved)."""

import pytest
import torch

from electra_plugin.models.core.contract import BatchLayout
from electra_plugin.profiling.host_work import HostWork
from electra_plugin.speed.unpad import Layout
from helpers import masked_batch, records, run, small_modern_encoder, tiny_model, train_cmd

PAD = 1  # the tiny dictionaries' and small_modern_encoder's padding index
LENGTHS = (38, 23, 7, 38)  # of 40 positions


def padded(tokens: torch.Tensor, lengths) -> torch.Tensor:
    """``tokens`` with row i padded after ``lengths[i]`` tokens."""
    tokens = tokens.clone()
    for row, length in enumerate(lengths):
        tokens[row, length:] = PAD
    return tokens


def nonzero_sites(work: HostWork) -> list:
    """The host syncs of ``work`` that unpad.py's nonzero asked for."""
    return [site for site in work.sync_sites
            if site.startswith("nonzero at") and "electra_plugin/speed/unpad.py:" in site]


def test_static_rows_hold_each_sequence_whole_and_in_order_first():
    """Static rows: a permutation of the B*T positions whose first N are the nonzero rows
    (same order, same positions), the padding after them; the varlen kernel's cu_seqlens
    delimit each sequence's tokens in order there and its longest length is the padded
    length. Built without a host sync, where the nonzero layout needs some."""
    mask = padded(torch.full((4, 40), 5), LENGTHS).eq(PAD)
    with HostWork() as static_work:
        static = Layout(mask, 4, 40, "cpu", static=True)
        cu_seqlens, longest = static.sequences
    with HostWork() as eager_work:
        eager = Layout(mask, 4, 40, "cpu")
        eager_cu_seqlens, eager_longest = eager.sequences
    assert static_work.syncs == 0 and eager_work.syncs >= 2, (static_work.syncs,
                                                              eager_work.syncs)
    tokens = sum(LENGTHS)
    assert torch.equal(static.rows.sort().values, torch.arange(4 * 40))
    assert torch.equal(static.rows[:tokens], eager.rows)
    assert torch.equal(static.positions[:tokens], eager.positions)
    assert not static.padded[:tokens].any() and static.padded[tokens:].all()
    assert torch.equal(cu_seqlens, eager_cu_seqlens) and cu_seqlens.dtype == torch.int32
    assert (longest, eager_longest) == (40, max(LENGTHS))
    for i, length in enumerate(LENGTHS):
        assert torch.equal(static.rows[cu_seqlens[i]:cu_seqlens[i + 1]],
                           i * 40 + torch.arange(length)), i


def test_static_padded_rows_leave_the_layout_as_zeros_whatever_they_hold():
    """What the padded rows hold (a varlen kernel leaves them uninitialized: here NaN) does
    not reach the B x T grid, nor the rows' gradient when their gradient is NaN too."""
    mask = padded(torch.full((4, 40), 5), LENGTHS).eq(PAD)
    layout = Layout(mask, 4, 40, "cpu", static=True)
    x = torch.randn(4 * 40, 3, 2).masked_fill(layout.padded[:, None, None], float("nan"))
    x.requires_grad_(True)
    grid = layout.unpack(x)
    assert torch.equal(grid[mask], torch.zeros(int(mask.sum()), 3, 2))
    assert torch.equal(grid[~mask], x.detach()[:sum(LENGTHS)])
    rows = layout.real(x)
    rows.backward(torch.ones_like(rows).masked_fill(layout.padded[:, None, None],
                                                    float("nan")))
    assert torch.equal(x.grad, (~layout.padded).float()[:, None, None].expand_as(x))


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_static_rows_run_the_modern_encoder_without_a_sync_and_as_nonzero_rows(training):
    """The modern encoder (global layers on CPU's kernel, local ones on the window kernel)
    over a padded batch on the static rows a graph takes, run eager: no host sync forward
    or backward, and every state and gradient the nonzero rows give (zeros at the padding);
    the nonzero rows ask the host for the token count."""
    encoder = small_modern_encoder(window=8).train(training)
    tokens = padded(torch.randint(5, 50, (4, 40), generator=torch.Generator().manual_seed(0)),
                    LENGTHS)
    mask = tokens.eq(PAD)
    weights = torch.randn(4, 40, 32, generator=torch.Generator().manual_seed(1))
    results = {}
    for static in (True, False):
        encoder.zero_grad()
        batch = BatchLayout(mask, has_padding=True)
        if static:  # the layout a compiled graph builds (the body asks its batch for it)
            batch.cached("modern unpadded", lambda: Layout(mask, 4, 40, "cpu", static=True))
        with HostWork(where=True) as work:
            x, states = encoder.encode(tokens, batch, return_all_hiddens=True)
            (sum(s * weights for s in states) + x * weights).sum().backward()
        results[static] = [work, x.detach(), states,
                           {n: p.grad.clone() for n, p in encoder.named_parameters()}]
    (work, x, states, grads), (eager_work, eager_x, eager_states, eager_grads) = \
        results[True], results[False]
    assert work.syncs == 0, work.sync_sites
    assert nonzero_sites(eager_work), eager_work.sync_sites
    assert x[mask].abs().max() == 0 and eager_x[mask].abs().max() == 0
    torch.testing.assert_close(x, eager_x, rtol=1e-5, atol=1e-6)
    for a, b in zip(states, eager_states):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    top = max(g.abs().max() for g in eager_grads.values())
    for name, grad in eager_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6 * top)


def weighted(out):
    """The electra criterion's rule with its default weights (50, 1)."""
    return 50.0 * out.main_loss + out.generator_loss


def step_batch(task, lengths, seed):
    """A pre-training batch of len(lengths) rows of 24 positions, row i padded after
    ``lengths[i]`` tokens, with the collater's prediction slots: (src, target, positions,
    weights)."""
    from electra_plugin.data.masking import max_predictions, prediction_slots

    src, target, _, picked = masked_batch(task, rows=len(lengths), length=24, seed=seed)
    picked &= padded(src, lengths).ne(PAD)
    src, target = padded(src, lengths), padded(target, lengths)
    positions, weights = prediction_slots(picked, max_predictions(0.15, 24))
    return src, target, positions, weights


@pytest.mark.slow
def test_the_modern_step_compiles_whole_and_equals_the_eager_step():
    """The modern body's step (a global layer, a window-kernel local layer) under
    --graphed-step (aot_eager, ELECTRA_GRAPHED_STRICT=1 as the suite runs: no fall-back),
    gradients inside its graph, over two padded batches of one shape with different padding:
    one graph, no recompile; its loss and every gradient the eager step's within fp32
    rounding; the graph's update asks the host for nothing, the eager step's nonzero
    does."""
    from torch._dynamo.utils import counters

    from electra_plugin.speed.compile import compile_step

    options = dict(encoder_body="modern", num_layers=2, local_attention=8, dropout=0.0,
                   attention_dropout=0.0, temperature=0.0)
    (plain, task), (graphed, _) = (tiny_model(**options) for _ in range(2))
    graphed.load_state_dict(plain.state_dict())
    assert [layer.attn.window for layer in graphed.discriminator.encoder.layer] == [None, 4]
    assert compile_step(graphed, "aot_eager")
    graphed.electra_step.combine = weighted
    plain.train(), graphed.train()
    counters.clear()
    for lengths, seed in (((24, 15, 24, 9), 0), ((11, 24, 20, 24), 1)):
        batch = step_batch(task, lengths, seed)
        taken = {}
        for name, model in (("graphed", graphed), ("eager", plain)):
            model.zero_grad()
            with HostWork(where=True) as work:
                out = model(batch[0], target=batch[1], masked_positions=batch[2],
                            masked_weights=batch[3], has_padding=True)
                loss = weighted(out) if out.loss is None else out.loss
                loss.backward()
            taken[name] = (work, loss.detach(),
                           {n: p.grad.clone() for n, p in model.named_parameters()})
        (work, loss, grads), (eager_work, eager_loss, eager_grads) = \
            taken["graphed"], taken["eager"]
        assert graphed.electra_step.params is not None  # the graph took the gradients
        torch.testing.assert_close(loss, eager_loss, rtol=1e-6, atol=0)
        top = max(g.abs().max() for g in eager_grads.values())
        diff = max((grads[n] - g).abs().max() for n, g in eager_grads.items())
        print(f"\nlengths {lengths}: loss {loss.item():.6f} vs {eager_loss.item():.6f}, "
              f"largest gradient difference {diff:.2e} (largest gradient {top:.2f})")
        for name, grad in eager_grads.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6 * top)
        if seed:  # compiled at the first batch: this one replays the graph
            assert work.syncs == 0 and work.graph_kernels > 0, work.sync_sites
            assert nonzero_sites(eager_work), eager_work.sync_sites
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters.get("graph_break") and not counters.get("recompiles"), counters


@pytest.mark.slow
def test_fairseq_train_runs_the_modern_step_graphed_as_eager(data_bin, tmp_path):
    """fairseq-train --graphed-step with the modern body over padded blocks
    (--sample-break-mode complete), strict (no fall-back): one compiled graph, every batch
    padded to --tokens-per-sample, no graph break; its logged losses are the eager run's
    (dropout off: the graph's dropout draws its masks otherwise)."""
    from test_compile import counters_of, graphed_run

    options = ("--encoder-body", "modern", "--local-attention", "8", "--sample-break-mode",
               "complete", "--dropout", "0", "--attention-dropout", "0", "--max-update", "2",
               "--disable-validation")
    graphed = run(graphed_run(data_bin, tmp_path / "graphed", *options))
    assert graphed.returncode == 0, graphed.stderr[-3000:]
    assert "the step runs as one compiled graph (aot_eager, gradients inside)" in \
        graphed.stdout + graphed.stderr
    counters = counters_of(graphed.stdout)
    assert counters["stats"]["unique_graphs"] == 1 and not counters.get("graph_break"), \
        counters
    eager = run(train_cmd(data_bin, tmp_path / "eager", "--no-epoch-checkpoints", *options))
    assert eager.returncode == 0, eager.stderr[-3000:]
    logged = [records(p.stdout) for p in (graphed, eager)]
    assert [r["num_updates"] for r in logged[0]] == [r["num_updates"] for r in logged[1]] \
        == [1.0, 2.0]
    for a, b in zip(*logged):
        for key in ("loss", "disc_loss", "gen_loss", "disc_acc", "gnorm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-3), key
