"""The generator/discriminator model: sizes, RTD step semantics, bad sizes."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from fairseq import options
from omegaconf import OmegaConf

from electra_plugin.models.core.config import complete_config
from electra_plugin.models.core.flops import paper_train_flops
from electra_plugin.models.electra import ElectraModel
from electra_plugin.models.generators import model_sizes
from electra_plugin.models.loading import GDES_DELTA
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import make_task, masked_batch, tiny_model, tiny_model_config

OFFICIAL = {  # (layers, hidden, heads, ffn, embedding) and generator (hidden, heads, ffn)
    "electra_small": ((12, 256, 4, 1024, 128), (64, 1, 256)),
    "electra_base": ((12, 768, 12, 3072, 768), (256, 4, 1024)),
    "electra_large": ((24, 1024, 16, 4096, 1024), (256, 4, 1024)),
}


@pytest.mark.parametrize("arch", sorted(OFFICIAL))
def test_official_sizes_from_hydra_name_and_cli_arch(arch):
    sizes, gen = OFFICIAL[arch]
    fields = ("num_layers", "hidden_size", "num_heads", "ffn_size", "embedding_size")
    hydra_cfg = complete_config(OmegaConf.create({"_name": arch}))
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["data", "--task", "electra", "--arch", arch, "--criterion", "electra"])
    cli_cfg = complete_config(args)
    for cfg in (hydra_cfg, cli_cfg):
        assert tuple(cfg[f] for f in fields) == sizes
        generator = model_sizes(cfg)[1]
        assert (generator.hidden, generator.heads, generator.ffn) == gen


def test_explicit_sizes_win_over_the_arch():
    cfg = complete_config(OmegaConf.create({"_name": "electra_base", "num_layers": 6}))
    assert cfg.num_layers == 6 and cfg.hidden_size == 768


def test_small_discriminator_has_the_papers_14m_parameters():
    model, _ = ElectraModel.build_model(OmegaConf.create({"_name": "electra_small"}),
                                        make_task(vocab_size=30522)), None
    disc = sum(p.numel() for p in model.discriminator.parameters())
    disc += sum(p.numel() for p in model.discriminator_head.parameters())
    assert 13.4e6 < disc < 14.0e6  # HF google/electra-small-discriminator: 13.55M
    # generator shares the embedding block and ties its output layer to it
    assert model.generator.embeddings is model.discriminator.embeddings
    assert model.generator_head.embed_tokens[0] is model.discriminator.embeddings.word_embeddings


def test_untied_embeddings_are_separate():
    model, _ = tiny_model(embedding_sharing="untied")
    assert model.generator.embeddings is not model.discriminator.embeddings
    assert model.generator_head.embed_tokens[0] is model.generator.embeddings.word_embeddings


def test_generator_fraction_must_give_whole_heads():
    with pytest.raises(ElectraUsageError, match="whole number of 64-dim attention heads"):
        model_sizes(complete_config(OmegaConf.create({"_name": "electra_base",
                                                      "generator_size": 0.3})))
    with pytest.raises(ElectraUsageError, match="generator-size"):
        tiny_model(generator_size=0.1)
    generator = model_sizes(complete_config(
        OmegaConf.create({"_name": "electra_base", "generator_size": 0.5})))[1]
    assert (generator.hidden, generator.heads, generator.ffn) == (384, 6, 1536)


def test_plain_electra_needs_sizes():
    with pytest.raises(ElectraUsageError, match="model size is not set"):
        complete_config(OmegaConf.create({"_name": "electra"}))


def test_tokens_per_sample_must_fit_positions():
    with pytest.raises(ElectraUsageError, match="tokens-per-sample 513 is larger than the "
                                                "model's 512 positions"):
        tiny_model(make_task(tokens_per_sample=513))


def test_rtd_step_shapes_and_labels():
    model, task = tiny_model()
    src, target, original, picked = masked_batch(task)
    out = model(src, target=target)
    assert out.generator_log_probs.shape == (int(picked.sum()), len(task.dictionary))
    assert torch.equal(out.masked_targets, original[picked])
    assert out.main.shape == src.shape
    assert torch.equal(out.padding_mask, src.eq(task.dictionary.pad()))
    # only picked positions can be replaced
    assert not out.replaced[~picked].any()


def test_sample_equal_to_original_is_labelled_original():
    model, task = tiny_model()
    src, target, original, picked = masked_batch(task)
    # make the generator certain of one token: every sample is that token
    favourite = int(original[0, 1])
    with torch.no_grad():
        model.generator_head.bias[favourite] = 1e4
    out = model(src, target=target)
    assert torch.equal(out.replaced, picked & original.ne(favourite))
    assert out.replaced.any() and (picked & original.eq(favourite)).any()


def test_sampling_follows_the_generator_distribution():
    model, _ = tiny_model()
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20000, 3)
    torch.manual_seed(1)
    generator = model.generator_kind
    counts = torch.bincount(model.sample(logits, generator.temperature()),
                            minlength=3).float() / 20000
    assert torch.allclose(counts, torch.tensor([0.7, 0.2, 0.1]), atol=0.015)
    cold, _ = tiny_model(temperature=0.0)
    assert cold.generator_kind.temperature() == 0
    assert cold.sample(logits, cold.generator_kind.temperature()).eq(0).all()


def test_discriminator_loss_does_not_reach_the_generator():
    model, task = tiny_model(dropout=0.0, attention_dropout=0.0)
    src, target, _, _ = masked_batch(task)
    out = model(src, target=target)
    F.binary_cross_entropy_with_logits(out.main, out.replaced.float()).backward()
    assert all(p.grad is None for p in model.generator.encoder.parameters())
    assert all(p.grad is None for p in model.generator_head.parameters())
    assert model.discriminator.embeddings.word_embeddings.weight.grad.abs().sum() > 0


def test_padding_does_not_change_outputs():
    model, task = tiny_model(dropout=0.0, attention_dropout=0.0)
    model.eval()
    src, _, _, _ = masked_batch(task)
    row = src[:1, :12]
    padded = torch.cat([row, torch.full((1, 6), task.dictionary.pad())], dim=1)
    assert torch.allclose(model(row)[0], model(padded)[0][:, :12], atol=1e-5)


def test_classification_heads_start_as_the_official_output_layer():
    """The dense layer N(0, 0.02) and zero biases (HF's init); the output layer
    Glorot-uniform, as the official fine-tuning code's tf.layers.dense (limit
    sqrt(6 / (fan_in + fan_out))), or N(0, 0.02) with --classifier-init normal."""
    for init in ("glorot", "normal"):
        model, _ = tiny_model(classifier_init=init)
        torch.manual_seed(1)
        model.register_classification_head("cls", num_classes=8, inner_dim=512)
        head = model.classification_heads["cls"]
        # torch's default Linear init: std 1/sqrt(3 * 64) = 0.072 and nonzero biases
        assert abs(head.dense.weight.std().item() - 0.02) < 0.002
        w = head.out_proj.weight  # 8 x 512
        if init == "glorot":
            limit = math.sqrt(6 / (512 + 8))
            assert limit * 0.95 < w.abs().max() <= limit
            assert abs(w.std().item() - limit / math.sqrt(3)) < 0.1 * limit
        else:
            assert abs(w.std().item() - 0.02) < 0.002
        for layer in (head.dense, head.out_proj):
            assert abs(layer.weight.mean().item()) < 0.005
            assert not layer.bias.any()


def pair_batch(task):
    """A pair <s> A </s> B </s> and a single sentence <s> C </s> <pad>..., right-padded."""
    d = task.dictionary
    pair = [d.bos(), 10, 11, 12, d.eos(), 13, 14, d.eos()]
    single = [d.bos(), 15, 16, d.eos()]
    tokens = torch.full((2, len(pair)), d.pad())
    tokens[0] = torch.tensor(pair)
    tokens[1, :len(single)] = torch.tensor(single)
    # BERT's segments for [CLS] A [SEP] B [SEP]: 0 through the first [SEP], 1 after it
    types = torch.zeros_like(tokens)
    types[0, 5:] = 1
    return tokens, types


@pytest.mark.parametrize("segments", [True, False])
def test_pairs_get_the_token_types_the_encoder_was_pretrained_with(segments):
    model, task = tiny_model(dropout=0.0, attention_dropout=0.0,
                             segment_token_types=segments)
    model.eval()
    with torch.no_grad():  # distinct rows, so that a wrong type changes the output
        model.discriminator.embeddings.token_type_embeddings.weight.normal_(0, 1)
    tokens, types = pair_batch(task)
    expected = types if segments else torch.zeros_like(types)
    real = tokens.ne(task.dictionary.pad())
    with torch.no_grad():
        ours, _ = model(tokens, features_only=True)
        given, _ = model(tokens, features_only=True, token_types=expected)
        wrong, _ = model(tokens, features_only=True, token_types=types - expected)
    torch.testing.assert_close(ours[real], given[real], atol=1e-5, rtol=0)
    assert not torch.allclose(ours[0], wrong[0], atol=1e-3)  # the types do matter


def test_generator_layers_give_a_shallower_generator_counted_at_its_depth():
    model, task = tiny_model(generator_layers=0.5)
    assert len(model.generator.encoder.layer) == 1 and len(model.discriminator.encoder.layer) == 2
    src, target, _, picked = masked_batch(task)
    out = model(src, target=target)
    assert out.generator_log_probs.shape == (int(picked.sum()), len(task.dictionary))
    disc, gen = model_sizes(model.cfg)
    assert (disc.layers, gen.layers) == (2, 1)
    # the count is linear in the generator's depth: full - shallow = shallow - no layers
    full, _ = tiny_model(task)
    no_layers = paper_train_flops(disc, dataclasses.replace(gen, layers=0),
                                  len(task.dictionary), 20, 3, 10)
    shallow = model.train_flops(20, 3, 10)
    assert full.train_flops(20, 3, 10) - shallow == pytest.approx(shallow - no_layers)
    assert shallow > no_layers
    # the official Small with generator_layers 1/4 (and 1/3, as a float) of 12 layers
    for fraction, layers in ((0.25, 3), (1 / 3, 4), (1.0, 12)):
        cfg = complete_config(OmegaConf.create({"_name": "electra_small",
                                                "generator_layers": fraction}))
        assert model_sizes(cfg)[1].layers == layers


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5, 0.25, 0.3])
def test_generator_layers_must_give_whole_layers(fraction):
    with pytest.raises(ElectraUsageError) as e:
        tiny_model(generator_layers=fraction)
    message = str(e.value)
    assert "\n" not in message and "not a whole number from 1 to 2" in message
    assert message.endswith("use a multiple of 1/2 in (0, 1]")


@pytest.mark.slow
@pytest.mark.parametrize("sharing", ["shared", "gdes"])
def test_gdes_keeps_the_discriminator_loss_off_the_shared_embeddings(sharing):
    model, task = tiny_model(embedding_sharing=sharing, dropout=0.0, attention_dropout=0.0)
    shared = model.generator.embeddings.word_embeddings.weight
    assert model.generator_head.embed_tokens[0].weight is shared  # the MLM head stays tied
    src, target, _, _ = masked_batch(task)
    out = model(src, target=target)
    F.binary_cross_entropy_with_logits(out.main, out.replaced.float()).backward()
    if sharing == "shared":
        assert shared.grad.abs().sum() > 0
        return
    delta = model.discriminator.embeddings.word_embeddings.delta
    assert shared.grad is None and delta.grad.abs().sum() > 0
    # nor any other generator weight: positions, token types and LayerNorm are not shared
    assert all(p.grad is None for p in model.generator.parameters())
    delta.grad = None
    F.nll_loss(out.generator_log_probs, out.masked_targets).backward()
    assert shared.grad.abs().sum() > 0 and delta.grad is None


def test_gdes_checkpoint_gives_a_finetuning_model_the_folded_embeddings():
    model, task = tiny_model(embedding_sharing="gdes", dropout=0.0, attention_dropout=0.0)
    with torch.no_grad():  # a residual as training leaves it (zero at the start)
        model.discriminator.embeddings.word_embeddings.delta.normal_(0, 0.05)
    state = model.state_dict()
    finetuning = ElectraModel(model.cfg, task.dictionary, pretraining=False)
    finetuning.load_state_dict(dict(state))
    own = finetuning.state_dict()
    assert GDES_DELTA not in own and all(k.startswith("discriminator.") for k in own)
    assert torch.equal(own["discriminator.embeddings.word_embeddings.weight"],
                       state["generator.embeddings.word_embeddings.weight"] + state[GDES_DELTA])
    src, _, _, _ = masked_batch(task)
    model.eval()
    finetuning.eval()
    with torch.no_grad():
        torch.testing.assert_close(finetuning(src, features_only=True)[0],
                                   model(src, features_only=True)[0], atol=1e-6, rtol=0)


def test_mean_pooling_classification_head_reads_every_real_token():
    """--classifier-pooling mean: the head sees the mean of the non-pad tokens' features,
    so a change of any real token moves it and padding does not; first reads <s> only."""
    model, task = tiny_model(dropout=0.0, attention_dropout=0.0, classifier_pooling="mean")
    model.register_classification_head("sentiment", num_classes=2)
    model.eval()
    d = task.dictionary
    src = torch.tensor([[d.bos(), 10, 11, 12, d.eos(), d.pad()]])
    logits, _ = model(src, classification_head_name="sentiment")
    features, _ = model(src, features_only=True)
    pooled = features[0, :5].mean(0)
    head = model.classification_heads["sentiment"]
    assert torch.allclose(logits[0], head.out_proj(F.gelu(head.dense(pooled))), atol=1e-6)
    longer = torch.cat([src, torch.full((1, 3), d.pad())], 1)
    assert torch.allclose(model(longer, classification_head_name="sentiment")[0], logits,
                          atol=1e-5)
    first, _ = tiny_model(task, dropout=0.0, attention_dropout=0.0)
    first.register_classification_head("sentiment", num_classes=2)
    first.eval()
    out, _ = first(src, classification_head_name="sentiment")
    features, _ = first(src, features_only=True)
    head = first.classification_heads["sentiment"]
    assert torch.allclose(out[0], head.out_proj(F.gelu(head.dense(features[0, 0]))), atol=1e-6)


def test_step_with_the_collaters_positions_and_padding_flag_is_the_same_step():
    """What the task's collater passes (masked_positions, has_padding) spares the step two
    host syncs and changes nothing else."""
    model, task = tiny_model(dropout=0.0, attention_dropout=0.0)
    src, target, _, picked = masked_batch(task)
    torch.manual_seed(1)
    found = model(src, target=target)
    torch.manual_seed(1)
    given = model(src, target=target,
                  masked_positions=picked.flatten().nonzero().squeeze(1), has_padding=True)
    assert torch.equal(found.main_loss, given.main_loss) and torch.equal(found.main, given.main)
    assert torch.equal(found.generator_loss, given.generator_loss)
    assert torch.equal(found.positions, given.positions)


@pytest.mark.parametrize("old, new", [
    (dict(tie_generator=True, generator_size=1.0), dict(generator="tied")),
    (dict(two_stage_updates=3, generator_size=1.0, untie_embeddings=True),
     dict(generator="two_stage", two_stage_updates=3)),
    (dict(generator_training="adversarial", untie_embeddings=True, generator_size=0.5),
     dict(generator="adversarial", embedding_sharing="untied", generator_size=0.5)),
    (dict(objective="mlm", generator_size=0.25), dict(objective="mlm")),
])
def test_a_version_1_checkpoint_loads_under_todays_options(old, new):
    """Before the checkpoint version key (format 1) the generator variants were flags; such a
    checkpoint's config reads as today's options and its weights load unchanged."""
    task = make_task()
    model, _ = tiny_model(task, **new)
    state = model.state_dict()
    assert int(state.pop("version")) == 2
    version_1 = dict(dict(tie_generator=False, generator_training="mle",
                          untie_embeddings=False, generator_size=0.25), **old)
    upgraded = complete_config(tiny_model_config(**version_1))
    today = complete_config(tiny_model_config(**new))
    assert {k: upgraded[k] for k in today} == dict(today)
    loaded = ElectraModel.build_model(upgraded, task)
    loaded.load_state_dict(state)
    assert int(loaded.version) == 2
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in state.items())


def test_a_checkpoint_of_a_newer_format_is_one_line():
    model, _ = tiny_model()
    state = model.state_dict()
    state["version"] = torch.tensor(3)
    with pytest.raises(ElectraUsageError, match="newer version of the plugin"):
        tiny_model()[0].load_state_dict(state)
