"""transformers conversion of the DeBERTa and ModernBERT bodies: every class each family
serves, imported from random transformers models and checked against transformers' own
forward on the same inputs, exported back bit for bit, and the config options the bodies do
not implement refused in one line."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402

from electra_plugin.convert import from_hf, to_hf  # noqa: E402
from electra_plugin.user_io.errors import ElectraUsageError  # noqa: E402
from conversion_helpers import (FAIRSEQ_INDEX, FAMILIES, MASK_ID, SIZES, VOCAB,  # noqa: E402
                                assert_close, bert_batch, hf_model, load_fairseq, save_hf)

from transformers import BertTokenizer  # noqa: E402

HEADS = ["ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
         "ForMultipleChoice"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return BertTokenizer(str(path), do_lower_case=True)


def largest_difference(ours, theirs, mask):
    return (ours - theirs)[mask].abs().max().item()


@pytest.mark.parametrize("body", ["deberta", "modern"])
def test_pretraining_pair_imports_equal_to_transformers_and_exports_bit_for_bit(
        body, bert, tmp_path):
    prefix = FAMILIES[body][0]
    disc = hf_model(body, "Model", seed=1)
    gen = hf_model(body, "ForMaskedLM", seed=2, num_hidden_layers=2)
    getattr(gen, gen.base_model_prefix).embeddings.load_state_dict(disc.embeddings.state_dict())
    disc_dir, gen_dir = save_hf(disc, tmp_path / "d"), save_hf(gen, tmp_path / "g")
    result = from_hf(disc_dir, gen_dir, out_dir=tmp_path / "imported")
    model, task = load_fairseq(result.checkpoint, tmp_path / "imported")
    assert model.cfg.encoder_body == body and model.cfg.generator_layers == 0.5
    assert model.generator.embeddings is model.discriminator.embeddings  # tied as HF's

    ids, mask = bert_batch(bert)
    assert not mask.all()
    with torch.no_grad():
        theirs = disc(ids, attention_mask=mask.long())
        hidden, _ = model.discriminator(FAIRSEQ_INDEX[ids])
    diff = largest_difference(hidden, theirs.last_hidden_state, mask)
    picked = mask & (torch.arange(ids.size(1)) % 3 == 1) & ids.ne(VOCAB.index("[SEP]"))
    masked = ids.masked_fill(picked, MASK_ID)
    with torch.no_grad():
        their_logits = gen(masked, attention_mask=mask.long()).logits[picked]
        gen_hidden, _ = model.generator(FAIRSEQ_INDEX[masked])
        our_logits = model.generator_head(gen_hidden[picked])[:, FAIRSEQ_INDEX]
    gen_diff = (our_logits - their_logits).abs().max().item()
    print(f"\n{body}: {prefix}Model {diff:.1e}, {prefix}ForMaskedLM {gen_diff:.1e}")
    assert diff <= 1e-5 and gen_diff <= 1e-5

    out = tmp_path / "hf"
    exported = to_hf(result.checkpoint, out)
    assert (exported.architecture, exported.generator_architecture) == \
        (prefix + "Model", prefix + "ForMaskedLM")
    for original, written in ((disc_dir, out), (gen_dir, out / "generator")):
        theirs, ours = load_file(original / "model.safetensors"), load_file(
            written / "model.safetensors")
        assert sorted(theirs) == sorted(ours)
        assert all(torch.equal(theirs[k], ours[k]) for k in theirs)
        config = json.loads((written / "config.json").read_text())
        assert config["model_type"] == disc.config.model_type
    reloaded = getattr(transformers, prefix + "ForMaskedLM").from_pretrained(out / "generator")
    with torch.no_grad():
        assert torch.equal(reloaded(masked, attention_mask=mask.long()).logits[picked],
                           their_logits)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer(["the cat"]).input_ids == bert(["the cat"]).input_ids


@pytest.mark.parametrize("suffix", HEADS)
@pytest.mark.parametrize("body", ["deberta", "modern"])
def test_heads_import_equal_to_transformers_and_export_back(body, suffix, bert, tmp_path):
    labels = {"ForSequenceClassification": 3, "ForTokenClassification": 4}.get(suffix, 2)
    extra = dict(classifier_pooling="mean") if body == "modern" and \
        suffix == "ForSequenceClassification" else {}
    hf = hf_model(body, suffix, seed=3, num_labels=labels, **extra)
    prefix = FAMILIES[body][0]
    hf_dir = save_hf(hf, tmp_path / "hf")
    result = from_hf(hf_dir, out_dir=tmp_path / "imported")
    if result.task in ("squad", "sentence_ranking"):  # tasks that read their own data files
        from fairseq import checkpoint_utils, tasks
        from omegaconf import OmegaConf

        task = tasks.setup_task(OmegaConf.create({"_name": "masked_lm", "data": str(
            tmp_path / "imported"), "tokens_per_sample": 64}))
        model = checkpoint_utils.load_model_ensemble([str(result.checkpoint)],
                                                     task=task)[0][0].eval()
    else:
        model, _ = load_fairseq(result.checkpoint, tmp_path / "imported")
    ids, mask = bert_batch(bert)
    head = next(iter(model.classification_heads.values()))
    with torch.no_grad():
        features, _ = model.discriminator(FAIRSEQ_INDEX[ids])
        if suffix == "ForMultipleChoice":
            theirs = hf(ids[None], attention_mask=mask.long()[None]).logits[0]
            ours = head(features).squeeze(-1)
        else:
            out = hf(ids, attention_mask=mask.long())
            ours = head(features, ~mask) if suffix == "ForSequenceClassification" else \
                head(features)
            if suffix == "ForQuestionAnswering":
                theirs = torch.stack([out.start_logits, out.end_logits], -1)[mask]
                if getattr(head, "transform", None) is not None:  # ModernBERT's ``head``
                    features = head.transform(features)
                ours = head.out_proj(features)[mask]  # the span head's layer, (start, end)
            elif suffix == "ForTokenClassification":
                theirs, ours = out.logits[mask], ours[mask]
            else:
                theirs = out.logits
    print(f"\n{prefix}{suffix}: {(ours - theirs).abs().max().item():.1e}")
    assert_close(ours, theirs)
    out_dir = tmp_path / "back"
    assert to_hf(result.checkpoint, out_dir).architecture == prefix + suffix
    config = json.loads((out_dir / "config.json").read_text())
    assert config.get("classifier_pooling", "cls") == extra.get("classifier_pooling", "cls")
    theirs, ours = load_file(hf_dir / "model.safetensors"), load_file(
        out_dir / "model.safetensors")
    assert sorted(theirs) == sorted(ours) and all(torch.equal(theirs[k], ours[k])
                                                  for k in theirs)


@pytest.mark.parametrize("body,option,value,named", [
    ("deberta", "relative_attention", False, "relative_attention False"),
    ("deberta", "position_biased_input", True, "position_biased_input True"),
    ("deberta", "pos_att_type", ["c2p"], "pos_att_type ['c2p']"),
    ("deberta", "share_att_key", False, "share_att_key False"),
    ("modern", "local_attention", 256, "local_attention 256"),
    ("modern", "norm_bias", True, "norm_bias True"),
    ("modern", "layer_types", ["full_attention"] * 4, "layer_types"),
])
def test_unsupported_options_are_refused_in_one_line_naming_them(body, option, value, named,
                                                                 tmp_path):
    model = hf_model(body, "Model", seed=4)
    hf_dir = save_hf(model, tmp_path / "hf")
    config = json.loads((hf_dir / "config.json").read_text())
    config[option] = value
    (hf_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ElectraUsageError) as error:
        from_hf(hf_dir, out_dir=tmp_path / "imported")
    message = str(error.value)
    assert named in message and "not supported" in message and "\n" not in message, message
    assert not (tmp_path / "imported" / "checkpoint.pt").exists()


def test_projected_models_are_refused_in_one_line(tmp_path):
    from helpers import tiny_model

    from electra_plugin.models.core.checkpoint import write_checkpoint

    model = hf_model("modern", "Model", seed=5)
    hf_dir = save_hf(model, tmp_path / "hf")
    from_hf(hf_dir, out_dir=tmp_path / "imported")  # the data directory of the checkpoint below
    # a projected model (embedding size != hidden size): no ModernBERT class has the slot
    projected, _ = tiny_model(encoder_body="modern", embedding_size=32)
    path = tmp_path / "projected.pt"
    write_checkpoint(path, projected.cfg, {"_name": "masked_lm", "data": str(
        tmp_path / "imported")}, {k: v for k, v in projected.state_dict().items()})
    with pytest.raises(ElectraUsageError, match="have no slot for") as error:
        to_hf(path, tmp_path / "out")
    assert "\n" not in str(error.value)



def test_generator_with_the_enhanced_mask_decoder_stays_in_the_fairseq_checkpoint(tmp_path):
    from electra_plugin.models.core.checkpoint import load_checkpoint, write_checkpoint

    disc = hf_model("deberta", "Model", seed=6)
    gen = hf_model("deberta", "ForMaskedLM", seed=7, num_hidden_layers=2)
    result = from_hf(save_hf(disc, tmp_path / "d"), save_hf(gen, tmp_path / "g"),
                     out_dir=tmp_path / "imported")
    state = load_checkpoint(result.checkpoint)
    weights = dict(state["model"], **{"generator.position_embeddings.weight": torch.zeros(
        SIZES["max_position_embeddings"], SIZES["hidden_size"])})
    model_cfg = dict(state["cfg"].model, enhanced_mask_decoder=True)
    path = tmp_path / "emd.pt"
    write_checkpoint(path, model_cfg, state["cfg"].task, weights, criterion_cfg={
        "_name": "electra"})
    exported = to_hf(path, tmp_path / "hf")
    assert exported.generator_dir is None and not (tmp_path / "hf" / "generator").exists()
    assert exported.architecture == "DebertaV2Model"
    ours, theirs = load_file(tmp_path / "hf" / "model.safetensors"), load_file(
        tmp_path / "d" / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
