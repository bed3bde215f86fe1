"""One whole pre-training step of the plugin against HF transformers' ELECTRA classes.

The plugin's ``electra`` model at the real ELECTRA-Small size (``--arch electra_small``:
12 layers, hidden 256, 4 heads, FFN 1024, embeddings 128, generator 1/4) runs one step on
real English text: Python's reference manual as it ships with the interpreter
(``pydoc_data.topics``), tokenized the way ``scripts/demo.py`` does it (a sentencepiece
model trained by ``electra-prepare``), blocked and masked by the ``electra`` task,
with the loss of the ``electra`` criterion (lambda = 50).

The same weights, renamed through the converter's key table (``electra_plugin.convert``),
go into ``transformers.ElectraForMaskedLM`` (generator) and ``ElectraForPreTraining``
(discriminator), which share one embedding module as the plugin's two encoders do; the
generator's output layer is the word embedding matrix on both sides. HF then computes its
own losses: the generator on the masked input with labels at the masked positions, the
discriminator on the plugin's corrupted input (its generator samples) with labels
"differs from the original". Losses and the gradient of every parameter must agree.

Tolerance, per quantity (a: plugin, b: HF): ``|a - b| <= 1e-5 * |b|`` for the generator,
discriminator and total losses and, for each gradient tensor, ``||a - b||_2 <= 1e-5 *
||b||_2 + 1e-12`` (the atol only matters for an all-zero gradient). The attention key
biases are the exception: their exact gradient is 0 (softmax ignores a shift shared by all
of a query's scores), so both sides must be below 1e-5 times the norm of the same layer's
key weight gradient instead. HF runs its eager (matmul + softmax) attention, the plugin its own fused QKV and
``scaled_dot_product_attention``, so the two sides share no attention code.
"""

import re
import sys

import pytest
import torch

from helpers import run

transformers = pytest.importorskip(
    "transformers", reason="the HF parity test needs transformers (pip install -e '.[hf]')")

from omegaconf import OmegaConf  # noqa: E402

from electra_plugin.convert.families import BERT  # noqa: E402
from electra_plugin.convert.hf_files import encoder_fields, hf_config  # noqa: E402
from electra_plugin.convert.keys import (  # noqa: E402
    CONFIG_TABLE,
    HF_ARCHITECTURES,
    component_of,
    expand,
    permute_rows,
    rename,
    symbols,
)
from electra_plugin.criterions.electra import ElectraCriterion  # noqa: E402
from electra_plugin.models.electra import ElectraModel
from electra_plugin.models.loading import BOOKKEEPING_KEYS  # noqa: E402
from electra_plugin.tasks.electra_pretraining import (  # noqa: E402
    ElectraPretrainingConfig,
    ElectraPretrainingTask,
)

RTOL = 1e-5
ATOL = 1e-12  # for gradients that are exactly zero on both sides
DISC_WEIGHT = 50.0
BATCH, LENGTH = 8, 128  # ELECTRA-Small's sequence length
VOCAB_SIZE = 2000  # sentencepiece pieces, specials included


def english_corpus(path) -> int:
    """Prose of Python's reference manual, one sentence per line (the input format of
    electra-prepare), a blank line between topics (documents); code examples, grammar
    rules, lists and headings are left out. Returns the number of sentences."""
    import pydoc_data.topics

    lines = []
    for name in sorted(pydoc_data.topics.topics):
        sentences = []
        for block in re.split(r"\n\s*\n", pydoc_data.topics.topics[name]):
            rows = block.split("\n")
            if any(row[:1].isspace() for row in rows):  # indented: code, grammar, lists
                continue
            text = " ".join(row.strip() for row in rows)
            prose = sum(c.isalpha() or c == " " for c in text) >= 0.85 * len(text)
            if len(text) < 60 or not text[0].isupper() or not text.endswith(".") or not prose:
                continue
            # short enough that a sentence fits a 128-token block with --sample-break-mode
            # complete
            sentences += [s for s in re.split(r"(?<=\.)\s+(?=[A-Z])", text) if len(s) <= 300]
        if sentences:
            lines += sentences + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return sum(1 for line in lines if line)


@pytest.fixture(scope="module")
def english_data(tmp_path_factory):
    """The corpus through electra-prepare, as scripts/demo.py prepares its data."""
    root = tmp_path_factory.mktemp("hf_parity")
    assert english_corpus(root / "corpus.txt") >= 400
    proc = run([sys.executable, "-m", "electra_plugin.cli.prepare", "--train",
                root / "corpus.txt", "--destdir", root / "bin", "--sentencepiece-vocab-size",
                str(VOCAB_SIZE), "--workers", "1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "bin"


def perturb(model, seed):
    """Move every LayerNorm and bias away from its init (ones and zeros), so that a bias or
    gain mapped to the wrong place, or not applied, changes the numbers."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.add_(0.02 * torch.randn(p.shape, generator=gen))


def plugin_step(data):
    """(model, task, batch, criterion loss, logging output, PretrainingOutput)."""
    task = ElectraPretrainingTask.setup_task(ElectraPretrainingConfig(
        data=str(data), tokens_per_sample=LENGTH, sample_break_mode="complete", seed=1))
    task.load_dataset("train")
    dataset = task.datasets["train"]
    # the longest block and seven others of several lengths: a padded B x ~128 batch
    order = sorted(range(len(dataset)), key=lambda i: -int(dataset.size(i)))
    picks = [order[0]] + order[1::len(order) // BATCH][1:BATCH]
    batch = dataset.collater([dataset[i] for i in picks])

    cfg = OmegaConf.create({"_name": "electra_small", "dropout": 0.0, "attention_dropout": 0.0})
    torch.manual_seed(0)
    model = ElectraModel.build_model(cfg, task).float()
    perturb(model, seed=1)
    model.train()  # dropout is 0: the training path, deterministic
    criterion = ElectraCriterion(task, disc_weight=DISC_WEIGHT)
    outputs = []
    hook = model.register_forward_hook(lambda module, args, out: outputs.append(out))
    try:
        loss, sample_size, log = criterion(model, batch)
    finally:
        hook.remove()
    loss.backward()
    assert sample_size == 1 and len(outputs) == 1
    return model, task, batch, loss, log, outputs[0]


def hf_models(model, task):
    """ElectraForPreTraining + ElectraForMaskedLM holding the plugin's weights, renamed by
    the converter's tables, with one shared embedding module -> (disc, gen, name map).

    The name map takes each plugin parameter name to the HF parameter it became.
    """
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    cfg = model.cfg
    dictionary = task.source_dictionary
    vocab, pad = len(dictionary), dictionary.pad()
    state = {k: v for k, v in model.state_dict().items() if k not in BOOKKEEPING_KEYS}
    by_component = {}
    for key, value in state.items():
        by_component.setdefault(component_of(key), {})[key] = value
    fields = {ours: cfg[ours] for ours, _ in CONFIG_TABLE}
    built, names = {}, {}
    for architecture, fields_ in (("ElectraForPreTraining", fields),
                                  ("ElectraForMaskedLM",
                                   encoder_fields(fields, model.generator_kind.size()))):
        components = HF_ARCHITECTURES[architecture]
        params = expand(components, {c: symbols(fields_, vocab) for c in components})
        part = {k: v for c in components for k, v in by_component[c].items()}
        hf_state = rename(part, params, to_hf=True, where=architecture)
        # a sentencepiece dictionary: the converter keeps fairseq's row order (no vocab.txt)
        permute_rows(hf_state, params, to_hf=True, fairseq_index=None)
        config = hf_config(fields_, architecture, vocab, pad, torch.float32)
        config._attn_implementation = "eager"
        hf = getattr(transformers, architecture)(config).float()
        missing, unexpected = hf.load_state_dict(hf_state, strict=False)
        assert not unexpected
        # the only parameter the table leaves out is the tied LM output weight
        assert set(missing) <= {"generator_lm_head.weight"}, missing
        built[architecture] = hf
        names.update({p.fairseq: (architecture, p.hf) for p in params})
    disc, gen = built["ElectraForPreTraining"], built["ElectraForMaskedLM"]
    assert isinstance(disc, ElectraForPreTraining) and isinstance(gen, ElectraForMaskedLM)
    # the plugin's generator reads the discriminator's embedding block: share the module
    for name, tensor in gen.electra.embeddings.state_dict().items():
        assert torch.equal(tensor, disc.electra.embeddings.state_dict()[name]), name
    gen.electra.embeddings = disc.electra.embeddings
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
    disc.train(), gen.train()  # dropout 0 in their configs
    return disc, gen, names


def hf_parameter(disc, gen, architecture, name):
    hf = disc if architecture == "ElectraForPreTraining" else gen
    return dict(hf.named_parameters(remove_duplicate=False))[name]


def relative(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


@pytest.mark.slow
def test_pretraining_step_matches_transformers(english_data):
    model, task, batch, loss, log, out = plugin_step(english_data)
    pad, mask_idx = task.source_dictionary.pad(), task.mask_idx
    src, target = batch["net_input"]["src_tokens"], batch["target"]
    attention = src.ne(pad)
    assert src.size(0) == BATCH and 100 < src.size(1) <= LENGTH
    assert not attention.all()  # blocks of several lengths: real padding
    assert target.ne(pad).sum() > 100 and src.eq(mask_idx).any()
    assert model.generator.embeddings is model.discriminator.embeddings
    assert model.generator_head.embed_tokens[0] is model.discriminator.embeddings.word_embeddings

    disc, gen, names = hf_models(model, task)
    # settings the plugin hard-codes, as the HF configs carry them
    for hf in (disc, gen):
        assert hf.config.layer_norm_eps == BERT.fixed["layer_norm_eps"] == 1e-12
        assert hf.config.hidden_act == BERT.fixed["hidden_act"] == "gelu"
        assert hf.config.pad_token_id == pad == model.padding_idx
        assert getattr(hf.config, "position_embedding_type", "absolute") == "absolute"
    for module in [*model.modules(), *disc.modules(), *gen.modules()]:
        if isinstance(module, torch.nn.LayerNorm):
            assert module.eps == 1e-12
    assert gen.config.hidden_size == 64 and gen.config.num_attention_heads == 1
    assert gen.config.intermediate_size == 256 and disc.config.num_hidden_layers == 12
    # positions: both count from 0 at <s>, row i of the table is position i; pad's row is
    # padding_idx on both sides (no gradient)
    assert torch.equal(disc.electra.embeddings.position_ids[0, :LENGTH], torch.arange(LENGTH))
    assert disc.electra.embeddings.word_embeddings.padding_idx == pad
    assert model.discriminator.embeddings.word_embeddings.padding_idx == pad
    assert gen.electra.embeddings is disc.electra.embeddings
    assert gen.generator_lm_head.weight is disc.electra.embeddings.word_embeddings.weight

    # the plugin's generator samples and the labels, computed here from the batch
    corrupted = out.corrupted
    masked = target.ne(pad)
    original = torch.where(masked, target, src)
    assert torch.equal(corrupted[~masked], src[~masked])
    assert not corrupted[masked].eq(mask_idx).all()
    replaced = corrupted.ne(original)
    assert torch.equal(out.replaced, replaced)
    assert 0 < replaced.sum() <= masked.sum()

    gen_out = gen(input_ids=src, attention_mask=attention.long(),
                  labels=torch.where(masked, target, -100))
    disc_out = disc(input_ids=corrupted, attention_mask=attention.long(),
                    labels=replaced.long())
    hf_total = gen_out.loss + DISC_WEIGHT * disc_out.loss
    hf_total.backward()

    diffs = {
        "gen_loss": abs(log["gen_loss"].item() - gen_out.loss.item()) / gen_out.loss.item(),
        "disc_loss": abs(log["disc_loss"].item() - disc_out.loss.item()) / disc_out.loss.item(),
        "total": abs(loss.item() - hf_total.item()) / hf_total.item(),
    }
    for name, value in diffs.items():
        assert value <= RTOL, f"{name}: relative difference {value:.2e}"

    # every parameter of the plugin has its HF counterpart, and every HF parameter is one
    ours = dict(model.named_parameters())  # the shared embeddings once
    assert set(ours) <= set(names), sorted(set(ours) - set(names))
    theirs = {}
    for name, (architecture, hf_name) in names.items():
        theirs[name] = hf_parameter(disc, gen, architecture, hf_name)
    hf_ids = {id(p) for hf in (disc, gen) for p in hf.parameters()}
    assert {id(theirs[name]) for name in ours} == hf_ids
    # the generator's view of the shared block is the same HF tensor as the discriminator's
    for name in names:
        if name.startswith("generator.embeddings."):
            twin = "discriminator" + name[len("generator"):]
            assert theirs[name] is theirs[twin], name
    grad_diffs, failing = {}, []
    for name, p in ours.items():
        mine, other = p.grad, theirs[name].grad
        assert mine is not None and other is not None, name
        assert other.shape == mine.shape, name
        grad_diffs[name] = relative(mine, other)
        if name.endswith("attention.self.key.bias"):
            # exactly 0: a key bias adds q_i . b_k to all of query i's scores, which the
            # softmax ignores; both sides hold rounding noise (~1e-11), nothing to compare
            scale = ours[name[:-len("bias")] + "weight"].grad.double().norm().item()
            if max(mine.double().norm().item(), other.double().norm().item()) > RTOL * scale:
                failing.append(f"{name} not ~0")
            continue
        bound = RTOL * other.double().norm().item() + ATOL
        if (mine.double() - other.double()).norm().item() > bound:
            failing.append(f"{name} {grad_diffs[name]:.2e}")
    compared = {k: v for k, v in grad_diffs.items() if not k.endswith("self.key.bias")}
    worst = max(compared, key=compared.get)
    print(f"\nrelative differences: gen_loss {diffs['gen_loss']:.2e}, disc_loss "
          f"{diffs['disc_loss']:.2e}, total {diffs['total']:.2e}; gradients of "
          f"{len(compared)} tensors: max {compared[worst]:.2e} ({worst}); "
          f"{len(grad_diffs) - len(compared)} key biases ~0 on both sides")
    assert not failing, f"{len(failing)} gradients differ: {', '.join(failing[:6])}"
