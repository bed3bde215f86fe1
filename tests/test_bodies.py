"""Encoder bodies (``--encoder-body``): DeBERTa-v2/v3's body against transformers'
``DebertaV2Model`` on random weights, trained through fairseq-train, and the registry's
one-line refusal of an unknown body."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from electra_plugin.models.bodies import BODIES, body_named
from electra_plugin.models.core.config import EncoderSize, option_default
from electra_plugin.models.electra import init_bert_params
from electra_plugin.models.generators import model_sizes
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import (assert_main_error, assert_usage_error, assert_usage_line, masked_batch,
                     records, run, run_here, tiny_model, train_cmd)

VOCAB, PAD = 100, 1
HIDDEN, LAYERS, HEADS, FFN, MAX_POSITIONS = 64, 2, 4, 128, 64


def deberta_pair(buckets, type_vocab_size, enhanced_mask_decoder=False):
    """(the plugin's DeBERTa encoder, transformers' DebertaV2Model) with the same random
    weights, LayerNorms and biases moved off their init."""
    transformers = pytest.importorskip("transformers")
    cfg = OmegaConf.create(dict(embedding_size=HIDDEN, max_positions=MAX_POSITIONS,
                                type_vocab_size=type_vocab_size, dropout=0.0,
                                attention_dropout=0.0, position_buckets=buckets,
                                enhanced_mask_decoder=enhanced_mask_decoder))
    body = body_named("deberta")(cfg, VOCAB, PAD)
    torch.manual_seed(0)
    ours = body.encoder(body.embeddings(), EncoderSize(LAYERS, HIDDEN, HEADS, FFN, HIDDEN),
                        generator=enhanced_mask_decoder)
    ours.apply(init_bert_params)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.add_(0.02 * torch.randn(p.shape, generator=gen))
    config = transformers.DebertaV2Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=FFN, hidden_act="gelu",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        max_position_embeddings=MAX_POSITIONS, type_vocab_size=type_vocab_size,
        layer_norm_eps=1e-7, relative_attention=True, max_relative_positions=-1,
        position_buckets=buckets, pos_att_type=["p2c", "c2p"], share_att_key=True,
        norm_rel_ebd="layer_norm", position_biased_input=False, pad_token_id=PAD)
    hf = transformers.DebertaV2Model(config).eval()
    # the plugin's names are HF's (embedding size = hidden size: no projection)
    hf.load_state_dict({k: v for k, v in ours.state_dict().items()
                        if not k.startswith("position_embeddings")}, strict=True)
    return ours.eval(), hf


def padded_batch(length=40):
    """3 x length random tokens, two rows padded (after length - 9 and 12), and where they
    are real."""
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(3, VOCAB, (3, length), generator=gen)
    tokens[1, length - 9:] = PAD
    tokens[2, 12:] = PAD
    return tokens, tokens.ne(PAD)


@pytest.mark.parametrize("buckets,type_vocab_size", [(16, 0), (256, 2)])
def test_deberta_body_matches_transformers(buckets, type_vocab_size):
    """16 buckets over 64 positions: distances beyond 8 fall in the log buckets; 256
    (DeBERTa-v3's): every distance of 40 tokens is exact. Padding in the batch; the
    comparison is over the real tokens (padded positions are no one's output)."""
    ours, hf = deberta_pair(buckets, type_vocab_size)
    tokens, real = padded_batch()
    types = None
    if type_vocab_size:
        types = (torch.arange(40) >= 20).long().expand(3, -1) * real
    with torch.no_grad():
        x, states = ours(tokens, types, return_all_hiddens=True)
        out = hf(input_ids=tokens, attention_mask=real.long(), token_type_ids=types,
                 output_hidden_states=True)
    assert len(states) == len(out.hidden_states) == LAYERS + 1
    diffs = [(a - b)[real].abs().max().item() for a, b in zip(states, out.hidden_states)]
    diffs.append((x - out.last_hidden_state)[real].abs().max().item())
    print(f"\nbuckets {buckets}: largest difference vs transformers {max(diffs):.2e}")
    assert max(diffs) <= 1e-5, diffs


@pytest.mark.parametrize("sharing", ["shared", "gdes"])
def test_deberta_body_builds_both_encoders_steps_and_counts_its_flops(sharing):
    model, task = tiny_model(encoder_body="deberta", embedding_sharing=sharing)
    for encoder in (model.generator, model.discriminator):
        assert not hasattr(encoder.embeddings, "position_embeddings")
        assert encoder.encoder.rel_embeddings.weight.shape == (2 * 256, encoder.encoder.layer[
            0].attention.self.query_proj.in_features)
    src, target, _, _ = masked_batch(task)
    out = model(src, target=target)
    (out.main_loss + out.generator_loss).backward()
    assert model.discriminator.encoder.rel_embeddings.weight.grad.abs().sum() > 0
    assert model.generator.encoder.rel_embeddings.weight.grad.abs().sum() > 0
    # the relative embeddings are below every layer for layer-wise lr decay
    tags = model.discriminator.encoder.rel_embeddings.weight.optim_overrides
    assert next(iter(tags.values()))["depth"] == 0
    # FLOPs: BERT's count without the position lookup, plus the relative attention
    bert, _ = tiny_model(task, embedding_sharing=sharing)
    length, rows, span = 20, 3, 512
    expected = 0.0
    for size in model_sizes(model.cfg):
        h, e = size.hidden, size.embedding
        layer = 4 * h * span + 4 * length * size.heads + (4 * h * h + 6 * h) * span / length
        expected += 2 * length * rows * (size.layers * layer + 5 * h * span / length
                                         - 2 * e * length - e)
    assert model.train_flops(length, rows, 10) - bert.train_flops(length, rows, 10) == \
        pytest.approx(expected)


@pytest.mark.slow
def test_deberta_body_trains_through_fairseq_train(data_bin, tmp_path):
    save = tmp_path / "ck"
    result = run_here(train_cmd(data_bin, save, "--max-update", "2", "--no-epoch-checkpoints",
                                "--disable-validation", "--encoder-body", "deberta",
                                "--objective", "electra"))
    assert result.returncode == 0, result.stderr[-3000:]
    logs = records(result.stdout)
    assert [r["num_updates"] for r in logs] == [1, 2]
    assert all(math.isfinite(r[key]) for r in logs
               for key in ("loss", "gen_loss", "disc_loss", "train_flops"))
    # its checkpoint, resumed with the default body: the setting named, in one line
    assert_usage_error(train_cmd(data_bin, save, "--max-update", "3"),
                       "does not fit this model",
                       "--encoder-body deberta where this command gives --encoder-body bert")
    # a body option of its own with another value, and another body's options: named
    assert_usage_error(train_cmd(data_bin, save, "--max-update", "3", "--encoder-body",
                                 "deberta", "--position-buckets", "64"),
                       "--position-buckets 256 where this command gives --position-buckets 64")
    assert_usage_error(train_cmd(data_bin, save, "--max-update", "3", "--encoder-body",
                                 "modern", "--local-attention", "32"),
                       "--encoder-body deberta, --type-vocab-size 2, --local-attention 128 "
                       "where this command gives --encoder-body modern, --type-vocab-size 0, "
                       "--local-attention 32")
    # an unknown body through fairseq-train
    assert_usage_error(train_cmd(data_bin, tmp_path / "other", "--max-update", "1",
                                 "--encoder-body", "no_such_body"),
                       "--encoder-body no_such_body is not an encoder body", "bert, deberta")
    # electra_tiny projects its 64-dim embeddings, which DebertaV2's classes have no slot
    # for: one line, not a key mismatch
    from electra_plugin.cli import convert

    assert_main_error(convert.main, ["export", save / "checkpoint_last.pt", "--out",
                                     tmp_path / "hf"],
                      "DebertaV2's classes have no slot for", "keep the fairseq checkpoint")


def modern_pair(window, every):
    """(the plugin's ModernBERT encoder, transformers' ModernBertModel) with the same random
    weights (norms off their init)."""
    transformers = pytest.importorskip("transformers")
    cfg = OmegaConf.create(dict(embedding_size=HIDDEN, dropout=0.0, attention_dropout=0.0,
                                global_attn_every_n_layers=every, local_attention=window,
                                global_rope_theta=160000.0, local_rope_theta=10000.0))
    body = body_named("modern")(cfg, VOCAB, PAD)
    torch.manual_seed(0)
    ours = body.encoder(body.embeddings(), EncoderSize(4, HIDDEN, HEADS, 96, HIDDEN)).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.add_(0.1 * torch.randn_like(p)) if "norm" in name else p.normal_(0, 0.1)
    config = transformers.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=4, num_attention_heads=HEADS,
        intermediate_size=96, local_attention=window, global_attn_every_n_layers=every,
        pad_token_id=PAD, bos_token_id=0, eos_token_id=2, cls_token_id=0, sep_token_id=2,
        max_position_embeddings=256, attn_implementation="sdpa")
    hf = transformers.ModernBertModel(config).eval()
    renamed = {k.replace("embeddings.word_embeddings", "embeddings.tok_embeddings")
               .replace("encoder.layer.", "layers."): v for k, v in ours.state_dict().items()}
    hf.load_state_dict(renamed, strict=True)
    return ours, hf


@pytest.mark.parametrize("speed", ["1", "0"])
@pytest.mark.parametrize("window,every,length", [(16, 3, 40), (128, 2, 40), (16, 3, 200)])
def test_modern_body_matches_transformers_padded_and_unpadded(window, every, length, speed,
                                                               monkeypatch):
    """A 16-token window over 40 positions: the local layers see part of the sequence; over
    200, they run the window kernel's blocks (speed.window) at ELECTRA_SPEED=1.
    ELECTRA_SPEED=0 runs the layers on the padded grid, 1 on the real tokens alone."""
    monkeypatch.setenv("ELECTRA_SPEED", speed)
    ours, hf = modern_pair(window, every)
    tokens, real = padded_batch(length)
    with torch.no_grad():
        x, states = ours(tokens, return_all_hiddens=True)
        out = hf(input_ids=tokens, attention_mask=real.long(), output_hidden_states=True)
    assert len(states) == len(out.hidden_states) == 5
    diffs = [(a - b)[real].abs().max().item() for a, b in zip(states, out.hidden_states)]
    diffs.append((x - out.last_hidden_state)[real].abs().max().item())
    print(f"\nwindow {window}: largest difference vs transformers {max(diffs):.2e}")
    assert max(diffs) <= 1e-5, diffs
    assert x[~real].abs().max() == 0 if speed == "1" else torch.isfinite(x).all()


def test_modern_body_steps_without_token_types_and_counts_local_attention():
    model, task = tiny_model(encoder_body="modern", num_layers=4)
    assert model.cfg.type_vocab_size == 0 and not model.cfg.segment_token_types
    layers = model.discriminator.encoder.layer
    assert [layer.attn.window for layer in layers] == [None, 64, 64, None]
    assert isinstance(layers[0].attn_norm, torch.nn.Identity)
    assert all(m.bias is None for m in model.discriminator.encoder.modules()
               if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm)))
    src, target, _, _ = masked_batch(task)
    out = model(src, target=target)
    (out.main_loss + out.generator_loss).backward()
    assert all(p.grad is not None for p in model.discriminator.parameters())
    # a local layer's scores count the keys its kernel computes: over 600 tokens, three
    # blocks of half the 128-token window (192 keys); a window over most of it, all 600
    body = model.body
    disc = model_sizes(model.cfg)[0]
    local = body.paper_encoder_flops(disc, 50, 600, 1)
    model.cfg.local_attention = 1000
    assert body.paper_encoder_flops(disc, 50, 600, 1) - local == pytest.approx(
        2 * (2 * 2 * disc.hidden + 10 * disc.heads) * (600 - 192))


def test_unknown_body_is_a_one_line_error_that_lists_the_registered_ones():
    assert {"bert", "deberta"} <= set(BODIES)
    with pytest.raises(ElectraUsageError) as error:
        body_named("no_such_body")
    message = str(error.value)
    assert "\n" not in message and "--encoder-body no_such_body" in message
    assert all(name in message for name in BODIES)


@pytest.mark.parametrize("body", ["deberta", "modern"])
@pytest.mark.parametrize("size", ["small", "base"])
def test_body_presets_compose_to_the_body_arch_and_its_generator(body, size):
    from helpers import CONFIG_DIR, composed

    from electra_plugin.models.core.config import complete_config

    cfg = composed(CONFIG_DIR, f"electra_{body}_{size}", "task.data=/nonexistent")
    official = composed(CONFIG_DIR, f"electra_{size}", "task.data=/nonexistent")
    model = complete_config(cfg.model)
    assert model.encoder_body == body and model._name == f"electra_{body}_{size}"
    assert model.embedding_size == model.hidden_size  # no projection: HF's classes hold it
    generator = model_sizes(model)[1]
    assert (generator.hidden, generator.layers) == (model.hidden_size, model.num_layers // 2)
    assert cfg.optimization.lr == official.optimization.lr  # the official recipe of the size
    assert (cfg.model.get("embedding_sharing") == "gdes") == (body == "deberta")


def test_enhanced_mask_decoder_is_the_last_layer_twice_with_position_queries():
    """The official EnhancedMaskDecoder (DeBERTa repo, position_biased_input false) composed
    from transformers' own DebertaV2Layer with query_states: the states entering the last
    layer as keys and values, queries from them plus the absolute position embeddings, then
    from the first pass's output."""
    ours, hf = deberta_pair(16, 0, enhanced_mask_decoder=True)
    assert ours.position_embeddings.weight.shape == (MAX_POSITIONS, HIDDEN)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        ours.position_embeddings.weight.normal_(0, 0.1, generator=gen)
    tokens = torch.randint(3, VOCAB, (3, 40), generator=gen)
    tokens[1, 31:] = PAD
    real = tokens.ne(PAD)
    with torch.no_grad():
        x, _ = ours(tokens)
        entering = hf(input_ids=tokens, attention_mask=real.long(),
                      output_hidden_states=True).hidden_states[-2]
        encoder = hf.encoder
        query = entering + ours.position_embeddings.weight[:40]
        for _ in range(2):
            query = encoder.layer[-1](entering, encoder.get_attention_mask(real.long()),
                                      query_states=query, relative_pos=encoder.get_rel_pos(
                                          entering), rel_embeddings=encoder.get_rel_embedding())
            query = query[0] if isinstance(query, tuple) else query
    difference = (x - query)[real].abs().max().item()
    print(f"\nenhanced mask decoder: largest difference {difference:.1e}")
    assert difference <= 1e-5
    # only the generator decodes so; its FLOPs count one more pass of the last layer
    model, _ = tiny_model(encoder_body="deberta", enhanced_mask_decoder=True)
    plain, _ = tiny_model(encoder_body="deberta")
    assert model.generator.position_embeddings is not None
    assert model.discriminator.position_embeddings is None
    gen_size = model_sizes(model.cfg)[1]
    body = model.body
    extra = body.paper_encoder_flops(gen_size, 60, 20, 1, generator=True) - \
        body.paper_encoder_flops(gen_size, 60, 20, 1)
    layer = (body.paper_encoder_flops(EncoderSize(2, *[getattr(gen_size, f) for f in (
        "hidden", "heads", "ffn", "embedding")]), 60, 20, 1) -
        body.paper_encoder_flops(EncoderSize(1, *[getattr(gen_size, f) for f in (
            "hidden", "heads", "ffn", "embedding")]), 60, 20, 1))
    assert extra == pytest.approx(layer + 2 * gen_size.hidden * 20 + gen_size.hidden)
    assert model.train_flops(20, 3, 10) - plain.train_flops(20, 3, 10) == \
        pytest.approx(2 * 60 * extra)


VARIANTS = [dict(), dict(objective="electra_15"), dict(objective="replace_mlm"),
            dict(objective="all_tokens_mlm"), dict(objective="mlm"), dict(generator="unigram"),
            dict(generator="uniform"), dict(generator="adversarial"), dict(generator="tied"),
            dict(generator="two_stage", two_stage_updates=1), dict(embedding_sharing="untied"),
            dict(embedding_sharing="gdes"), dict(generator_layers=0.5),
            dict(generator="two_tower", objective="electric")]


@pytest.mark.parametrize("body", ["deberta", "modern"])
def test_every_generator_and_objective_trains_with_each_body(body):
    """One criterion step of every variant on each body: finite losses, gradients everywhere
    the step trains (the variants' code is the same for every body). Electric's towers attend
    one direction each, a mask the modern body (padding only) does not read: refused."""
    from helpers import sample_for

    from electra_plugin.criterions.electra import ElectraCriterion

    extra = [dict(embedding_sharing="gdes", enhanced_mask_decoder=True)] \
        if body == "deberta" else []
    towers = dict(generator="two_tower", objective="electric")
    if body == "modern":
        with pytest.raises(ElectraUsageError, match="--generator two_tower reads each tower in "
                           "one direction.*--encoder-body modern does not read"):
            tiny_model(encoder_body=body, **towers)
    for options in [v for v in VARIANTS if body != "modern" or v != towers] + extra:
        model, task = tiny_model(encoder_body=body, **options)
        loss, _, log = ElectraCriterion(task, 50.0)(model, sample_for(task))
        loss.backward()
        assert torch.isfinite(loss), options
        learning = [n for n, p in model.named_parameters() if p.requires_grad and
                    "classification_heads" not in n]
        frozen = [n for n in learning if model.get_parameter(n).grad is None]
        resting = {n for n, p in model.named_parameters()
                   if any(p is q for q in model.resting_parameters())}
        assert not set(frozen) - resting, (options, frozen[:3])


@pytest.mark.slow
@pytest.mark.parametrize("body", ["deberta", "modern"])
def test_body_resumes_exactly_fine_tunes_and_serves_through_transformers(body, spm_data,
                                                                         tmp_path):
    """Through fairseq-train with the body's small arch shrunk (DeBERTa with GDES and the
    enhanced mask decoder): 4 updates in one go == 2, stop, 2 more (dropout and sampling
    on); then RTE fine-tuning from that checkpoint, and the fine-tuned classifier exported
    to its transformers class, giving the plugin's logits."""
    from helpers import PLUGIN, assert_same_params, checkpoint, failure, preprocess, write_rte

    sizes = ["--arch", f"electra_{body}_small", "--num-layers", "2", "--hidden-size", "64",
             "--num-heads", "2", "--ffn-size", "96", "--embedding-size", "64",
             "--max-positions", "64"]
    once, twice = tmp_path / "once", tmp_path / "twice"
    # DeBERTa-v3's recipe: GDES and the enhanced mask decoder
    recipe = ("--embedding-sharing", "gdes", "--enhanced-mask-decoder") if body == "deberta" \
        else ()
    flags = ("--disable-validation", "--tokens-per-sample", "64", *sizes, *recipe)
    straight = run_here(train_cmd(spm_data, once, "--max-update", "4", *flags))
    assert straight.returncode == 0, failure("fairseq-train", straight)
    first = run_here(train_cmd(spm_data, twice, "--max-update", "2", *flags))
    resumed = run_here(train_cmd(spm_data, twice, "--max-update", "4", *flags))
    assert first.returncode == 0 and resumed.returncode == 0, failure("resume", resumed)
    keys = ("num_updates", "loss", "disc_loss", "gen_loss", "train_flops")
    assert [{k: r[k] for k in keys} for r in records(straight.stdout)] == \
        [{k: r[k] for k in keys} for r in records(first.stdout) + records(resumed.stdout)]
    assert_same_params(*(checkpoint(d / "checkpoint_last.pt")["model"] for d in (once, twice)),
                       atol=0.0, what="resumed vs uninterrupted")

    assert preprocess("RTE", write_rte(tmp_path / "glue"), spm_data,
                      tmp_path / "rte").returncode == 0
    tuned = tmp_path / "tuned"
    result = run_here([sys.executable, "-m", "fairseq_cli.train", tmp_path / "rte", "--user-dir",
                       PLUGIN, "--task", "sentence_prediction", "--criterion",
                       "sentence_prediction", *sizes, "--num-classes", "2", "--init-token", "0",
                       "--separator-token", "2", "--cpu", "--optimizer", "electra_adam", "--lr",
                       "1e-4", "--batch-size", "8", "--max-update", "2", "--save-dir", tuned,
                       "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0",
                       "--finetune-from-model", once / "checkpoint_last.pt"])
    assert result.returncode == 0, failure("fine-tuning", result)
    transformers = pytest.importorskip("transformers")
    from electra_plugin.convert import to_hf

    exported = to_hf(tuned / "checkpoint_last.pt", tmp_path / "hf")
    prefix = {"deberta": "DebertaV2", "modern": "ModernBert"}[body]
    assert exported.architecture == prefix + "ForSequenceClassification"
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf")
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(tuned / "checkpoint_last.pt")])
    model = models[0].eval()
    tokens = task.source_dictionary.encode_line("the cat sees a house", add_if_not_exist=False,
                                                append_eos=True).long()
    tokens = torch.cat([torch.tensor([0]), tokens])[None]
    with torch.no_grad():
        ours = model(tokens, classification_head_name="sentence_classification_head")[0]
        theirs = hf(tokens).logits  # rows in fairseq's order: the export kept them
    assert (ours - theirs).abs().max() <= 1e-5


@pytest.mark.parametrize("body", ["deberta", "modern"])
def test_bf16_autocast_step_of_each_body_stays_close_to_fp32(body):
    from helpers import sample_for

    from electra_plugin.criterions.electra import ElectraCriterion

    model, task = tiny_model(encoder_body=body, dropout=0.0, attention_dropout=0.0,
                             temperature=0)
    sample = sample_for(task)
    _, _, full = ElectraCriterion(task, 50.0)(model, sample)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, _, low = ElectraCriterion(task, 50.0)(model, sample)
    assert abs(low["gen_loss"].item() - full["gen_loss"].item()) < 0.05
    assert abs(low["disc_loss"].item() - full["disc_loss"].item()) < 0.01


@pytest.mark.slow
@pytest.mark.parametrize("body", ["modern"])
def test_two_gloo_workers_match_update_freq_2_with_each_body(body, data_bin, tmp_path):
    """--update-freq 2 on one process == 2 CPU processes (gloo), as for the BERT body; the
    modern body's (unpadded rows, its own masks; DeBERTa's step is BERT's in this respect,
    deberta passes too)."""
    from helpers import assert_metrics_equal, assert_same_params, checkpoint, ddp_train, train

    deterministic = ("--temperature", "0", "--dropout", "0", "--attention-dropout", "0",
                     "--max-update", "3", "--encoder-body", body)
    single = train(data_bin, tmp_path / "freq2", "--update-freq", "2", *deterministic)
    outputs = ddp_train(data_bin, tmp_path / "ddp", *deterministic)
    assert_metrics_equal(records(single), records(outputs[0][0]), f"{body}: update-freq 2 "
                                                                  f"vs 2 workers")
    assert_same_params(*(checkpoint(tmp_path / d / "checkpoint_last.pt")["model"]
                         for d in ("freq2", "ddp")), atol=1e-5, what=f"{body} DDP")


def test_trials_and_import_give_the_body_options_as_fairseq_train_parses_them(tmp_path):
    from fairseq import options
    from helpers import PLUGIN

    from electra_plugin.convert import model_cli_args
    from electra_plugin.finetuning import trials
    from electra_plugin.models.core.checkpoint import write_checkpoint

    model, _ = tiny_model(encoder_body="deberta", enhanced_mask_decoder=True,
                          position_buckets=32)
    path = write_checkpoint(tmp_path / "ck.pt", model.cfg, {"_name": "masked_lm",
                                                           "data": str(tmp_path)},
                            model.state_dict())
    for args in (list(trials.from_checkpoint(str(path)).model_args),
                 model_cli_args(model.cfg)):
        parsed = options.parse_args_and_arch(options.get_training_parser(), [
            str(tmp_path), "--user-dir", PLUGIN, "--task", "electra", *args])
        assert parsed.encoder_body == "deberta" and parsed.position_buckets == 32
        assert parsed.enhanced_mask_decoder is True


@pytest.mark.parametrize("body, option, value, owner", [
    ("bert", "position_buckets", 64, "deberta"),
    ("bert", "local_attention", 64, "modern"),
    ("deberta", "global_rope_theta", 8e4, "modern"),
    ("modern", "enhanced_mask_decoder", True, "deberta"),
])
def test_an_option_the_body_does_not_read_is_refused(body, option, value, owner):
    """Another body's option, set, is one line naming both bodies (as a generator kind
    refuses an option it does not read), not a model that silently ignores it; the option at
    its default passes."""
    extra = {"type_vocab_size": 0} if body == "modern" else {}
    with pytest.raises(ElectraUsageError) as caught:
        tiny_model(encoder_body=body, **{option: value}, **extra)
    assert_usage_line(caught.value, f"--{option.replace('_', '-')} {value} is an option of "
                                     f"--encoder-body {owner}, which --encoder-body {body} "
                                     f"does not read")
    tiny_model(encoder_body=body, **{option: option_default(option)}, **extra)


# ----------------------------------------------------- the contract, and a body of one's own

USER_BODY = Path(__file__).resolve().parent / "user_bodies" / "alibi"


@pytest.fixture(scope="module")
def every_body():
    """The registered bodies, a --user-dir one among them (tests/user_bodies/alibi)."""
    sys.path.insert(0, str(USER_BODY.parent))
    try:
        import alibi  # noqa: F401  (registers --encoder-body alibi)
    finally:
        sys.path.remove(str(USER_BODY.parent))
    return sorted(BODIES)


def test_every_body_keeps_the_encoder_contract(every_body):
    """For each registered body: both encoders are the typed Encoder; ``layers()`` is the
    discriminator's depth and layer-wise lr decay's tags follow it; ``forward`` is ``encode``
    over the batch's layout; a real token's output does not depend on the padding after it;
    the config is completed as the body says (token types); the other bodies' options are
    refused; its transformers family is found or refused in one line; FLOPs are counted."""
    from electra_plugin.convert.families import FAMILIES, family_of_body
    from electra_plugin.models.core.contract import BatchLayout, Encoder
    from electra_plugin.optim.layer_decay import TAG

    assert {"bert", "deberta", "modern", "alibi"} <= set(every_body)
    for name in every_body:
        model, task = tiny_model(encoder_body=name, dropout=0.0, attention_dropout=0.0)
        body = BODIES[name]
        assert isinstance(model.discriminator, Encoder) and isinstance(model.generator, Encoder)
        layers = model.discriminator.layers()
        assert len(layers) == model.cfg.num_layers, name
        below = {id(p) for m in model.discriminator.below_layers() for p in m.parameters()}
        assert below and below <= {id(p) for p in model.discriminator.parameters()}
        for depth, layer in enumerate(layers, start=1):
            assert all(p.optim_overrides[TAG]["depth"] == depth for p in layer.parameters())
        if not body.token_types:
            assert model.cfg.type_vocab_size == 0 and not model.cfg.segment_token_types
        model.eval()
        tokens = masked_batch(task, rows=3, length=12, seed=2)[2]
        padding = tokens.eq(model.padding_idx)
        assert padding.any(), "the batch must hold padding"
        with torch.no_grad():
            whole = model.discriminator(tokens)[0]
            assert torch.equal(whole, model.discriminator.encode(tokens, BatchLayout(padding))[0])
            for row in range(len(tokens)):  # each row alone, cut to its real tokens
                real = int((~padding[row]).sum())
                alone = model.discriminator(tokens[row:row + 1, :real])[0]
                torch.testing.assert_close(alone[0], whole[row, :real], rtol=1e-5, atol=1e-5)
        assert model.body.paper_encoder_flops(EncoderSize(2, 64, 2, 128, 64), 50, 12, 12) > 0
        for other, owner in BODIES.items():
            for option in owner.options if other != name else ():
                if option not in body.options:
                    with pytest.raises(ElectraUsageError, match=f"is an option of --encoder-body "
                                                                f"{other}"):
                        tiny_model(encoder_body=name, **{option: _other_value(option)})
        if name in FAMILIES:
            assert family_of_body(name, "ck.pt").body == name
        else:
            with pytest.raises(ElectraUsageError, match=f"ck.pt: --encoder-body {name} has no "
                                                        f"transformers family"):
                family_of_body(name, "ck.pt")


def _other_value(option):
    default = option_default(option)
    return (not default) if isinstance(default, bool) else 2 * default


@pytest.mark.slow
def test_a_body_from_a_user_dir(tmp_path, spm_data):
    """A body in one --user-dir file (post-LN with ALiBi): pre-trains through fairseq-train,
    resumes exactly (4 updates == 2, stop, 2 more), fine-tunes with every kind through
    trials, and its export is refused in one line (no transformers family)."""
    from helpers import (assert_one_line_error, assert_same_params, checkpoint, command, failure,
                         prepared_suite)

    def pretrain(save_dir, updates):
        cmd = train_cmd(spm_data, save_dir, "--max-update", str(updates), "--disable-validation",
                        "--encoder-body", "alibi")
        cmd[cmd.index("--user-dir") + 1] = str(USER_BODY)
        return run(cmd)

    once, twice = tmp_path / "once", tmp_path / "twice"
    straight, first = pretrain(once, 4), pretrain(twice, 2)
    resumed = pretrain(twice, 4)
    for proc in (straight, first, resumed):
        assert proc.returncode == 0, failure("fairseq-train --user-dir alibi", proc)
    keys = ("num_updates", "loss", "disc_loss", "gen_loss", "train_flops")
    assert [{k: r[k] for k in keys} for r in records(straight.stdout)] == \
        [{k: r[k] for k in keys} for r in records(first.stdout) + records(resumed.stdout)]
    ck = once / "checkpoint_last.pt"
    assert_same_params(checkpoint(ck)["model"], checkpoint(twice / "checkpoint_last.pt")["model"],
                       atol=0.0, what="resumed vs uninterrupted")

    suite = prepared_suite(tmp_path, spm_data)
    work = tmp_path / "work"
    proc = run(command("finetune", "trials", "--user-dir", USER_BODY, "--checkpoint", ck,
                       "--suite", suite, "--trials", "1", "--max-update", "2", "--cpu",
                       "--out-dir", work))
    assert proc.returncode == 0, failure("electra-finetune trials --user-dir alibi", proc)
    runs = json.loads((work / "trials.json").read_text())["runs"]
    assert sorted((r["task"], r["kind"]) for r in runs if not r.get("failed_run")) == [
        ("choice", "choice"), ("ner", "tagging"), ("opinions", "sentence"), ("squad", "squad")]
    assert all("--encoder-body alibi" in " ".join(r["command"]) for r in runs)

    export = run(command("convert", "export", "--checkpoint", ck, "--out-dir", tmp_path / "hf"))
    assert_one_line_error(export, "--encoder-body alibi has no transformers family",
                          "keep the fairseq checkpoint")
    assert not (tmp_path / "hf").exists()
