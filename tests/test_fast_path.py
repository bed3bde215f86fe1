"""The fast training step against a straightforward one, and the FLOPs accounting.

The straightforward step below is the RTD step written the plain way (three q/k/v
projections, SDPA, the generator's vocabulary projection at every position, cross-entropy
on its logits, boolean-indexed losses); the plugin's step must give the same losses and
gradients on the same batches, and the same losses over several updates.
"""

import copy
import math
import platform
import sys

import pytest
import torch
import torch.nn.functional as F
from fairseq import metrics
from omegaconf import OmegaConf

from electra_plugin.criterions.electra import ElectraCriterion
from electra_plugin.models.core.flops import (
    EncoderSize,
    FlopsCounter,
    executed_train_flops,
    paper_train_flops,
)
from electra_plugin.models.generators import model_sizes
from electra_plugin.models.electra import ElectraModel
from electra_plugin.speed.dropout import Dropout, random_int16
from helpers import (REPO, assert_one_line_error, built_from_command_line, electra_adam_cfg,
                     records, run, run_here, sample_for, tiny_model, tiny_model_config,
                     train_cmd)

DISC_WEIGHT = 50.0


# ------------------------------------------------------------------ the straightforward step


def plain_encoder(encoder, tokens, padding_mask):
    """ElectraTransformer.forward without dropout, one op per line of the BERT recipe."""
    emb = encoder.embeddings
    positions = torch.arange(tokens.size(1))
    x = emb.word_embeddings(tokens) + emb.position_embeddings(positions)
    x = emb.LayerNorm(x + emb.token_type_embeddings.weight[0])
    if encoder.embeddings_project is not None:
        x = encoder.embeddings_project(x)
    mask = (~padding_mask)[:, None, None, :]
    for layer in encoder.encoder.layer:
        att = layer.attention.self
        B, T, H = x.shape

        def split(t):
            return t.view(B, T, att.num_heads, -1).transpose(1, 2)

        q, k, v = split(att.query(x)), split(att.key(x)), split(att.value(x))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)
        x = layer.attention.output.LayerNorm(layer.attention.output.dense(a.reshape(B, T, H)) + x)
        x = layer.output.LayerNorm(layer.output.dense(F.gelu(layer.intermediate.dense(x))) + x)
    return x


def plain_losses(model, src, target, pad):
    """(gen_loss, disc_loss, loss) of the RTD step with argmax sampling (temperature 0)."""
    padding, masked = src.eq(pad), target.ne(pad)
    logits = model.generator_head(plain_encoder(model.generator, src, padding))  # B x T x V
    gen_loss = F.cross_entropy(logits[masked], target[masked])
    corrupted = src.clone()
    corrupted[masked] = logits[masked].detach().argmax(-1)
    replaced = corrupted.ne(torch.where(masked, target, src))
    disc_logits = model.discriminator_head(plain_encoder(model.discriminator, corrupted, padding))
    disc_loss = F.binary_cross_entropy_with_logits(disc_logits[~padding],
                                                   replaced[~padding].float())
    return gen_loss, disc_loss, gen_loss + DISC_WEIGHT * disc_loss


def deterministic_model():
    return tiny_model(dropout=0.0, attention_dropout=0.0, temperature=0.0)


def test_fast_step_matches_the_straightforward_step():
    model, task = deterministic_model()
    plain = copy.deepcopy(model)
    criterion = ElectraCriterion(task, DISC_WEIGHT)
    sample = sample_for(task)
    loss, _, log = criterion(model, sample)
    loss.backward()
    gen, disc, plain_loss = plain_losses(plain, sample["net_input"]["src_tokens"],
                                         sample["target"], task.dictionary.pad())
    plain_loss.backward()

    assert math.isclose(log["gen_loss"].item(), gen.item(), rel_tol=1e-5)
    assert math.isclose(log["disc_loss"].item(), disc.item(), rel_tol=1e-5)
    assert math.isclose(loss.item(), plain_loss.item(), rel_tol=1e-5)
    ours = dict(model.named_parameters())
    for name, p in plain.named_parameters():
        scale = p.grad.abs().max().item() + 1e-6
        assert torch.allclose(ours[name].grad, p.grad, atol=1e-5 * scale, rtol=1e-4), name


def test_a_run_matches_the_straightforward_run():
    """Five Adam updates on the same batches: the same losses at every update."""
    model, task = deterministic_model()
    plain = copy.deepcopy(model)
    criterion = ElectraCriterion(task, DISC_WEIGHT)
    opt_fast = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt_plain = torch.optim.Adam(plain.parameters(), lr=1e-3)
    for seed in range(5):
        sample = sample_for(task, seed=seed)
        loss, _, _ = criterion(model, sample)
        _, _, plain_loss = plain_losses(plain, sample["net_input"]["src_tokens"],
                                        sample["target"], task.dictionary.pad())
        assert math.isclose(loss.item(), plain_loss.item(), rel_tol=1e-4), seed
        for opt, value in ((opt_fast, loss), (opt_plain, plain_loss)):
            opt.zero_grad()
            value.backward()
            opt.step()


def test_bf16_autocast_step_stays_close_to_fp32():
    model, task = deterministic_model()
    criterion = ElectraCriterion(task, DISC_WEIGHT)
    sample = sample_for(task)
    _, _, full = criterion(model, sample)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, _, low = criterion(model, sample)
    assert abs(low["gen_loss"].item() - full["gen_loss"].item()) < 0.05
    assert abs(low["disc_loss"].item() - full["disc_loss"].item()) < 0.01


# ------------------------------------------------------------------ the parts made faster


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_keeps_the_expectation_and_masks_the_gradient(dtype):
    torch.manual_seed(0)
    drop = Dropout(0.1)
    x = torch.ones(400_003, dtype=dtype, requires_grad=True)  # not a whole number of draws
    y = drop(x)
    assert y.dtype == dtype
    (mask,) = y.grad_fn.saved_tensors
    assert mask.element_size() == 1  # what the backward pass keeps: a byte per element
    kept = y != 0
    # Bernoulli(0.9) keep mask, at each of the four 16-bit lanes of a 64-bit draw alike
    for lane in range(4):
        assert abs(1 - kept[lane::4].float().mean().item() - 0.1) < 0.003
    scale = torch.tensor(2**15 / round(0.9 * 2**15), dtype=dtype)
    assert torch.equal(y[kept], scale.expand(int(kept.sum())))
    assert abs(y.float().mean().item() - 1) < 0.003  # E[y] = x
    y.backward(torch.full_like(x, 2.0))
    assert torch.equal(x.grad != 0, kept)
    assert torch.equal(x.grad[kept], 2 * y[kept])
    drop.eval()
    assert drop(x) is x


def splitmix64(state):
    """Reference SplitMix64 output for one state, in Python integers."""
    z = state % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def test_compiled_dropout_keeps_the_expectation():
    """Under torch.compile (aot_eager: the graph's own ops) dropout keeps each element with
    probability 1 - p and scales it by 1 / (1 - p), as F.dropout."""
    p = 0.25
    compiled = torch.compile(lambda x: Dropout(p)(x), backend="aot_eager", fullgraph=True)
    torch.manual_seed(0)
    out = compiled(torch.ones(200_000))
    kept = out != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / (1 - p)))
    assert abs(out.mean().item() - 1.0) < 0.01


def test_dropout_bits_are_splitmix64_seeded_by_torch():
    torch.manual_seed(3)
    seed = torch.empty((), dtype=torch.int64).random_().item()
    torch.manual_seed(3)
    lanes = random_int16(4 * 50 - 1)  # the last 64-bit value is cut short
    expected = []
    for i in range(50):
        z = splitmix64(seed + i * 0x9E3779B97F4A7C15)
        expected += [(z >> (16 * lane)) & 0xFFFF for lane in range(4)]  # little-endian
    assert lanes.tolist() == [v - 2**16 if v >= 2**15 else v for v in expected[:-1]]
    assert not torch.equal(random_int16(199), lanes)  # a fresh seed each call
    torch.manual_seed(3)
    assert torch.equal(random_int16(199), lanes)


def test_dropout_below_the_mask_resolution_still_drops():
    # 1e-6 is below 2**-15: the bit mask cannot express it, F.dropout takes over
    y = Dropout(1e-6)(torch.ones(1000, requires_grad=True))
    assert y.requires_grad and torch.allclose(y, torch.ones(1000), atol=1e-5)


def adam_runs(optimizer_cls, dtype=torch.float32, eps=1e-6, **hyper):
    """Five updates of two groups (one decayed), one tensor skipping updates 2 and 4."""
    torch.manual_seed(0)
    params = [torch.randn(shape, dtype=dtype, requires_grad=True)
              for shape in [(7, 5), (5,), (3, 3), (4,)]]
    groups = [{"params": params[:2], "weight_decay": 0.1},
              {"params": params[2:], "weight_decay": 0.0, "lr": 3e-2}]
    optimizer = optimizer_cls(groups, lr=1e-2, betas=(0.9, 0.999), eps=eps, **hyper)
    for update in range(1, 6):
        for i, p in enumerate(params):
            p.grad = None if (i == 3 and update % 2 == 0) else torch.randn_like(p)
        optimizer.step()
        if update == 3:  # new state objects, the same values: a step must take them
            optimizer.load_state_dict(optimizer.state_dict())
    return params, optimizer.state_dict()


@pytest.mark.parametrize("fused,dtype,amsgrad", [
    (False, torch.float32, False), (False, torch.float32, True), (False, torch.bfloat16, False),
    (True, torch.float32, False), (True, torch.float32, True), (True, torch.bfloat16, False)])
@pytest.mark.parametrize("eps", [1e-6, 0.1])  # 0.1: where eps enters shows in the result
def test_multi_tensor_adam_is_fairseqs_adam(fused, dtype, amsgrad, eps):
    """foreach: bit for bit; fused: to rounding; amsgrad and bf16 take fairseq's loop."""
    from fairseq.optim.adam import Adam

    from electra_plugin.speed import MultiTensorAdam

    fast, fast_state = adam_runs(MultiTensorAdam, dtype, eps, amsgrad=amsgrad, fused=fused)
    loop, loop_state = adam_runs(Adam, dtype, eps, amsgrad=amsgrad)
    exact = not fused or amsgrad or dtype != torch.float32
    same = torch.equal if exact else lambda a, b: torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    for a, b in zip(fast, loop):
        assert same(a, b), (a - b).abs().max()
    for key, state in loop_state["state"].items():
        assert fast_state["state"][key]["step"] == state["step"]  # 3 for the skipping one
        for name in ("exp_avg", "exp_avg_sq"):
            assert same(fast_state["state"][key][name], state[name])
    assert fast_state["state"][3]["step"] == 3


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_electra_adam_updates_all_tensors_at_once(device):
    from fairseq import optim
    from fairseq.optim.fused_adam import get_fused_adam_class as fairseq_fused_adam

    from electra_plugin.speed import MultiTensorAdam

    if device == "cuda" and fairseq_fused_adam() is not None:
        pytest.skip("apex is installed: fairseq uses its FusedAdam on GPUs")
    optimizer = optim.build_optimizer(electra_adam_cfg(layer_decay=0.8),
                                      list(torch.nn.Linear(2, 2).to(device).parameters()))
    assert isinstance(optimizer.optimizer, MultiTensorAdam)


FRESH_BLOCK_FAULTS = """
import resource, torch
from electra_plugin.speed import retain_freed_memory

def faults_of_a_64mb_block():  # a block of the size just freed, written to
    torch.empty(16 << 20).fill_(1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(16 << 20).fill_(1)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

released = faults_of_a_64mb_block()
retained = retain_freed_memory()
print(released, retained, min(faults_of_a_64mb_block() for _ in range(3)))
"""


@pytest.mark.slow
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_retained_memory_spares_the_page_faults_of_the_next_update(data_bin, tmp_path):
    result = run([sys.executable, "-c", FRESH_BLOCK_FAULTS], fresh=True)  # glibc's own state
    released, retained, kept = result.stdout.split()
    assert retained == "True"
    # glibc's default: the freed 64 MB go back to the OS, so all 16,384 pages fault again
    assert int(released) > 8000, result.stdout
    assert int(kept) < int(released) // 20, result.stdout
    # fairseq-train on CPU turns it on; --release-cpu-memory leaves glibc's default
    notice = "freed memory stays in the process"
    assert notice in run(train_cmd(data_bin, tmp_path / "a", "--max-update", "1")).stdout
    released = run(train_cmd(data_bin, tmp_path / "b", "--max-update", "1",
                             "--release-cpu-memory"))
    assert released.returncode == 0 and "num_updates" in released.stdout
    assert notice not in released.stdout


@pytest.mark.parametrize("speed", ["1", "-sampling"])  # inverse CDF; Gumbel-max, the official
def test_sampling_follows_softmax_of_logits_over_temperature(speed, monkeypatch):
    monkeypatch.setenv("ELECTRA_SPEED", speed)
    model, _ = tiny_model(temperature=2.0)
    logits = 1000 + 2 * torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0]])).expand(30000, 4)
    torch.manual_seed(3)
    counts = torch.bincount(model.sample(logits, model.generator_kind.temperature()),
                            minlength=4).float() / 30000
    assert torch.allclose(counts, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.012)


# ------------------------------------------------------------------ FLOPs counting


def test_paper_flops_of_a_hand_computed_model():
    """One layer each, T = 3, V = 10, one predicted position, counted term by term."""
    disc = EncoderSize(layers=1, hidden=4, heads=1, ffn=8, embedding=2)
    gen = EncoderSize(layers=1, hidden=2, heads=1, ffn=4, embedding=2)
    # discriminator, per position: attention 3*(2*16+4) + 2*4*3 + (5+4+1)*3 + 2*4*3
    # + (2*16+4+4*4+4) + 5 = 247; FFN 2*4*8 + 8 + 8*8 + 2*8*4 + 4 + 4*4 + 4 + 5*4 = 244;
    # embeddings 2*2*10 + 2*2*(3+2) + 2*2 + 5*2 + 4*2 + (2*2*4 + 4) = 102; head
    # 2*16 + 4 + 8*4 + 2*4 = 76
    disc_position = 247 + 244 + 102 + 76
    # generator, per position: attention 3*(2*4+2) + 2*2*3 + 10*3 + 2*2*3 + (2*4+2+4*2+2)
    # + 5 = 109; FFN 2*2*4 + 4 + 8*4 + 2*4*2 + 2 + 4*2 + 2 + 5*2 = 90; embeddings without a
    # projection (E = H) 40 + 20 + 4 + 10 + 8 = 82
    gen_position = 109 + 90 + 82
    # generator output at the predicted position: 2*2*2 + 2 + 8*2 + 5*2 + 2*2*10 + 5*10 + 2*10
    gen_output = 146
    forward = 3 * disc_position + 3 * gen_position + gen_output
    assert paper_train_flops(disc, gen, vocab=10, length=3, predicted=1) == 2 * forward
    # executed matmuls: per position disc 2*4*16 + 2*2*4*8 + 2*2*4*3 + 2*2*4 (projection)
    # + 2*16 + 2*4 (head), gen 2*4*4 + 2*2*2*4 + 2*2*2*3; vocabulary head 2*2*2 + 2*2*10
    executed = 3 * (320 + 40 + 88) + 1 * 48
    assert executed_train_flops(disc, gen, 10, 3, 1, predicted=1) == 3 * executed
    assert executed_train_flops(disc, gen, 10, 3, 1, predicted=1,
                                full_vocab_generator=True) == 3 * (executed + 2 * 48)


@pytest.mark.parametrize("arch, batch, length, steps, official", [
    # google-research/electra flops_computation.py, MODEL_FLOPS
    ("electra_small", 128, 128, 1e6, 1.293743798272e18),
    ("electra_base", 256, 512, 766e3, 6.424541834277683e19),
    ("electra_large", 2048, 512, 1.75e6, 3.113952642891776e21),
])
def test_paper_flops_of_the_official_runs(arch, batch, length, steps, official):
    from electra_plugin.models.core.config import complete_config

    disc, gen = model_sizes(complete_config(OmegaConf.create({"_name": arch})))
    ours = paper_train_flops(disc, gen, 30522, length, batch) * steps
    assert ours == pytest.approx(official, rel=1e-12)


def test_counter_survives_half_precision_and_fine_tuning_drops_it():
    model, task = tiny_model()
    model.flops_counter.add(1.5e18 + 3)
    model.half()
    assert model.flops_counter.flops.dtype == torch.float64
    assert model.flops_counter.flops.item() == 1.5e18 + 3
    state = model.state_dict()
    assert state[FlopsCounter.KEY].item() == 1.5e18 + 3

    fresh, _ = tiny_model(task)
    fresh.load_state_dict({k: v for k, v in state.items() if k != FlopsCounter.KEY})
    assert fresh.flops_counter.flops.item() == 0  # older checkpoints start at 0
    fresh.load_state_dict(state)
    assert fresh.flops_counter.flops.item() == 1.5e18 + 3

    finetune = ElectraModel(model.cfg, task.dictionary, pretraining=False)
    finetune.load_state_dict({k: v.float() for k, v in state.items()})
    assert FlopsCounter.KEY not in finetune.state_dict()


def test_flops_reduce_once_per_update_over_micro_batches():
    """--update-freq 2 (or 2 workers): fairseq sums both batches' logs, the count grows once."""
    task = tiny_model()[1]
    model = task.build_model(tiny_model_config())  # the task keeps the model's counter
    criterion = ElectraCriterion(task, DISC_WEIGHT)
    logs = [criterion(model, sample_for(task, seed=s))[2] for s in (0, 1)]
    disc, gen = model_sizes(model.cfg)
    expected = sum(paper_train_flops(disc, gen, len(task.dictionary), 20, 3,
                                     predicted=int(log["masked"])) for log in logs)
    for update in (1, 2):
        with metrics.aggregate() as agg:
            task.reduce_metrics(logs, criterion)
        assert model.flops_counter.flops.item() == pytest.approx(update * expected, rel=1e-12)
        assert agg.get_smoothed_values()["train_flops"] == round(update * expected)
    model.eval()
    _, _, log = criterion(model, sample_for(task))
    assert "flops" not in log  # validation is not training compute


@pytest.mark.slow
def test_train_flops_survive_an_end_of_epoch_resume(data_bin, tmp_path):
    """fairseq drops its meters when it resumes from an end-of-epoch checkpoint; the count
    lives in the model and goes on. The tiny valid split gives 3 updates per epoch."""
    def train(save_dir, epochs):
        result = run_here(train_cmd(data_bin, save_dir, "--train-subset", "valid",
                                    "--disable-validation", "--max-epoch", str(epochs)))
        assert result.returncode == 0, result.stderr[-3000:]
        return records(result.stdout)

    once = train(tmp_path / "once", 2)
    train(tmp_path / "twice", 1)
    resumed = train(tmp_path / "twice", 2)
    assert [r["num_updates"] for r in once] == [1, 2, 3, 4, 5, 6]
    assert [r["num_updates"] for r in resumed] == [4, 5, 6]
    flops = [r["train_flops"] for r in once]
    assert all(b > a for a, b in zip(flops, flops[1:]))
    # every update of 8 x 32 tokens costs about the same (the masked count varies a little)
    assert flops[-1] == pytest.approx(6 * flops[0], rel=0.05)
    assert resumed[-1]["train_flops"] == pytest.approx(flops[-1], rel=1e-5)
    saved = torch.load(tmp_path / "twice" / "checkpoint_last.pt", weights_only=False)
    assert saved["model"][FlopsCounter.KEY].item() == pytest.approx(flops[-1], rel=1e-5)


# ------------------------------------------------------------------ the switch


def test_speed_switch_off_gives_the_plain_ops(monkeypatch):
    """ELECTRA_SPEED=0: dropout is F.dropout (same draws), attention and the q/k/v
    projection are three Linears + SDPA, the optimizer is fairseq's Adam, glibc untouched."""
    from fairseq import optim
    from fairseq.optim.adam import Adam

    from electra_plugin.speed import attention, project_qkv, retain_freed_memory

    monkeypatch.setenv("ELECTRA_SPEED", "0")
    x = torch.randn(4, 7, 64, requires_grad=True)
    torch.manual_seed(5)
    ours = Dropout(0.1)(x)
    torch.manual_seed(5)
    assert torch.equal(ours, F.dropout(x, 0.1, training=True))
    layer = tiny_model()[0].discriminator.encoder.layer[0].attention.self
    q, k, v = project_qkv(layer, x)
    heads = layer.num_heads

    def split(t):
        return t.view(4, 7, heads, -1).transpose(1, 2)

    torch.manual_seed(6)
    out = attention(q, k, v, None, dropout_p=0.2)
    torch.manual_seed(6)
    plain = F.scaled_dot_product_attention(split(layer.query(x)), split(layer.key(x)),
                                           split(layer.value(x)), dropout_p=0.2)
    torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-6)
    optimizer = optim.build_optimizer(electra_adam_cfg(layer_decay=0.8),
                                      list(torch.nn.Linear(2, 2).parameters()))
    assert type(optimizer.optimizer) is Adam
    assert retain_freed_memory() is False
    monkeypatch.setenv("ELECTRA_SPEED", "1")  # and on: the fast parts (same projection)
    torch.testing.assert_close(project_qkv(layer, x)[0], q, rtol=1e-5, atol=1e-6)
    torch.manual_seed(5)
    assert not torch.equal(Dropout(0.1)(x), ours)  # its own mask


def test_the_switch_turns_off_the_parts_it_names_and_refuses_other_words(monkeypatch):
    """ELECTRA_SPEED: unset or 1 every part at its default, 0 all off, -PART,... those parts
    off, +PART a part that is off by default on; a word that names no part is one line
    listing the parts, and a part the code asks for must exist."""
    from electra_plugin.speed.switch import PARTS, enabled
    from electra_plugin.user_io.errors import ElectraUsageError

    default_off = {part for part, p in PARTS.items() if not p.default}
    assert default_off == {"trees", "replay"}
    for value, off in (("1", default_off), ("0", set(PARTS)),
                       ("-window, -dropout", {"window", "dropout"} | default_off),
                       ("+trees,-seed", {"seed", "replay"}), ("0,+trees", set(PARTS))):
        monkeypatch.setenv("ELECTRA_SPEED", value)
        assert {part for part in PARTS if not enabled(part)} == off, value
        assert enabled() is (not value.startswith("0"))
    monkeypatch.delenv("ELECTRA_SPEED")
    assert {part for part in PARTS if not enabled(part)} == default_off
    for value in ("-windw", "window", "off", "-window,+windw", "trees"):
        monkeypatch.setenv("ELECTRA_SPEED", value)
        with pytest.raises(ElectraUsageError, match="names no part; give 0 .* one of "
                                                    "accumulate, adam, allocator"):
            enabled("window")
    monkeypatch.setenv("ELECTRA_SPEED", "1")
    with pytest.raises(ValueError, match="'windw' is no part"):
        enabled("windw")


def test_every_part_is_asked_for_by_the_code_and_named_in_the_docs():
    """Each part of the switch is read somewhere in the plugin, and docs/speed.md's table of
    the switch gives every part with the switch's own words (what it does, what runs
    instead, its default and its file, which exists), and no other."""
    import re

    from electra_plugin.speed.switch import PARTS

    source = "".join(p.read_text() for p in (REPO / "electra_plugin").rglob("*.py"))
    asked = set(re.findall(r"enabled\(\"(\w+)\"\)", source))
    assert asked == set(PARTS), asked ^ set(PARTS)
    docs = (REPO / "docs" / "speed.md").read_text()
    rows = re.findall(r"^\| `([a-z]+)` \| (on|off) \| (.+) \| (.+) \| `(.+)` \|$", docs, re.M)
    table = {part: (does.replace("`", ""), instead.replace("`", ""), where, default == "on")
             for part, default, does, instead, where in rows}
    assert table == {part: tuple(p) for part, p in PARTS.items()}
    assert all((REPO / "electra_plugin" / p.where).is_file() for p in PARTS.values())
    assert set(re.findall(r"ELECTRA_SPEED=[-+]([a-z]+)", docs)) <= set(PARTS)


@pytest.mark.slow
def test_a_misspelled_part_ends_a_run_in_one_line(data_bin, tmp_path):
    proc = run(train_cmd(data_bin, tmp_path / "ckpt", "--max-update", "1"),
               env=dict(ELECTRA_SPEED="-windw"))
    assert_one_line_error(proc, "ELECTRA_SPEED=-windw", "'-windw' names no part", "window")


@pytest.mark.parametrize("switch", ["1", "-walks"])
def test_the_per_update_walks_do_what_fairseqs_do(switch, monkeypatch):
    """model.train()/eval() leave every module in the mode asked for, one switched by hand
    included; set_num_updates reaches each module that takes it (by its class or on the
    instance, a shared one once) and no other."""
    monkeypatch.setenv("ELECTRA_SPEED", switch)
    model = tiny_model()[0]
    model.train()
    model.discriminator.encoder.layer[1].eval()  # a submodule switched on its own
    assert model.train() is model
    assert all(m.training for m in model.modules())
    model.eval()
    assert not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())

    class Counted(torch.nn.Module):
        def set_num_updates(self, n):
            self.seen = getattr(self, "seen", []) + [n]

    by_class, on_instance = Counted(), torch.nn.Linear(2, 2)
    on_instance.set_num_updates = lambda n: setattr(on_instance, "seen", [n])
    model.discriminator.extra = by_class
    model.generator.extra = by_class  # shared: reached twice, told once
    model.discriminator.other = on_instance
    model.set_num_updates(7)
    assert by_class.seen == [7] and on_instance.seen == [7]
    for m in model.modules():  # nothing else in the model takes the count
        if m is not model and m not in (by_class, on_instance):
            assert not hasattr(m, "set_num_updates"), type(m)


@pytest.mark.slow
def test_a_run_without_the_speed_work_learns_the_same(data_bin, tmp_path, monkeypatch):
    """fairseq-train with ELECTRA_SPEED=0 and without dropout logs the same losses and
    gradient norms; electra_adam clips them (fairseq's loop or one _foreach_norm) every
    update and steps (fairseq's Adam or the fused kernel). The generator takes its argmax:
    the two sampling methods draw other samples from the same distribution (the test of
    sampling above)."""
    no_dropout = ("--max-update", "5", "--dropout", "0", "--attention-dropout", "0",
                  "--temperature", "0", "--optimizer", "electra_adam", "--clip-norm", "0.5")
    fast = run_here(train_cmd(data_bin, tmp_path / "fast", *no_dropout))
    monkeypatch.setenv("ELECTRA_SPEED", "0")
    plain = run_here(train_cmd(data_bin, tmp_path / "plain", *no_dropout))
    assert fast.returncode == 0 and plain.returncode == 0, plain.stderr[-2000:]
    assert "freed memory stays" in fast.stdout and "freed memory stays" not in plain.stdout
    a, b = records(fast.stdout), records(plain.stdout)
    assert len(a) == len(b) == 5
    for ra, rb in zip(a, b):
        assert ra["clip"] == rb["clip"] == 100.0  # clipped: gnorm above 0.5
        for key in ("loss", "gen_loss", "disc_loss", "gnorm"):
            assert abs(ra[key] - rb[key]) <= 0.002 + 1e-4 * abs(ra[key]), (key, ra, rb)


@pytest.mark.parametrize("switch", ["1", "-seed"])
def test_the_step_seed_draws_as_fairseqs(switch, data_bin, monkeypatch):
    """fairseq's Trainer seeds torch before each step with the run's seed plus the update
    count; the plugin's seeding (no lazy seeds for uninitialised backends) leaves the CPU
    generator drawing what torch.manual_seed's would, at every update count."""
    from fairseq import utils
    from fairseq.trainer import Trainer

    monkeypatch.setenv("ELECTRA_SPEED", switch)
    cfg, task, model = built_from_command_line(data_bin, "--seed", "11")
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    for updates in (0, 5):
        trainer.set_num_updates(updates)
        trainer._set_seed()
        ours = torch.rand(4)
        utils.set_torch_seed(11 + updates)
        assert torch.equal(ours, torch.rand(4)), updates
