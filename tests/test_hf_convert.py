"""HF transformers <-> fairseq checkpoint conversion, checked against transformers itself.

Randomly initialised transformers ELECTRA models of real shapes (the paper's Small config
with all 12 layers, a Base-shaped one cut to 2 layers, one with untied embeddings and
odd sizes, a tiny one whose generator has a quarter of the layers) on a small WordPiece
vocabulary: imported, run on English text next to transformers, exported again, and loaded
by transformers and fairseq. A GDES pre-training run exports its folded discriminator.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from conversion_helpers import (FAIRSEQ_INDEX, MASK_ID, TEXTS, VOCAB, assert_close, bert_batch,
                                load_fairseq, randomize, save_hf)
from helpers import (
    PLUGIN, assert_main_error, assert_one_update_from, run, run_here, train_from_model_cfg,
)

transformers = pytest.importorskip(
    "transformers", reason="HF conversion tests need transformers (pip install -e '.[hf]')")

from fairseq import options  # noqa: E402
from fairseq_cli import preprocess  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    BertTokenizer,
    ElectraConfig,
    ElectraForMaskedLM,
    ElectraForPreTraining,
    ElectraForSequenceClassification,
    ElectraModel,
)

from electra_plugin.cli import convert  # noqa: E402
from electra_plugin.convert import from_hf, model_cli_args, to_hf  # noqa: E402
from electra_plugin.convert.keys import (  # noqa: E402
    HF_ARCHITECTURES,
    KEY_TABLE,
    component_of,
    expand,
    permute_rows,
    rename,
    symbols,
)
from electra_plugin.data.tokenizer import load_tokenizer  # noqa: E402
from electra_plugin.models.core.checkpoint import (  # noqa: E402
    build_fairseq_config,
    load_checkpoint,
    write_checkpoint,
)
from electra_plugin.models.core.encoder import DisentangledEmbedding  # noqa: E402
from electra_plugin.models.hub_interface import from_pretrained as hub  # noqa: E402
from electra_plugin.models.loading import GDES_DELTA  # noqa: E402
from electra_plugin.user_io.errors import ElectraUsageError  # noqa: E402

SMALL = dict(embedding_size=128, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
             intermediate_size=1024)
CASES = {
    # name: (discriminator config, generator sizes, tie the embeddings)
    "small": (SMALL, dict(hidden_size=64, num_attention_heads=1, intermediate_size=256), True),
    "base2": (dict(embedding_size=768, hidden_size=768, num_hidden_layers=2,
                   num_attention_heads=12, intermediate_size=3072),
              dict(hidden_size=256, num_attention_heads=4, intermediate_size=1024), True),
    "untied": (dict(embedding_size=96, hidden_size=192, num_hidden_layers=2,
                    num_attention_heads=3, intermediate_size=384, type_vocab_size=3,
                    max_position_embeddings=128),
               dict(hidden_size=128, num_attention_heads=2, intermediate_size=256), False),
    "shallow": (dict(embedding_size=32, hidden_size=64, num_hidden_layers=4,
                     num_attention_heads=2, intermediate_size=128, max_position_embeddings=64),
                dict(hidden_size=32, num_attention_heads=1, intermediate_size=64,
                     num_hidden_layers=1), True),
}
TINY = dict(embedding_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=128, max_position_embeddings=64)
def hf_config(**sizes):
    return ElectraConfig(vocab_size=len(VOCAB), **sizes)


def one_line_error(excinfo, *phrases):
    message = str(excinfo.value)
    assert message.startswith("electra_plugin: error: ") and "\n" not in message, message
    for phrase in phrases:
        assert phrase in message, message
    return message


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_convert")
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return path


@pytest.fixture(scope="module")
def bert(root):
    """transformers' own WordPiece tokenizer on the test vocabulary."""
    return BertTokenizer(str(root / "vocab.txt"), do_lower_case=True)


@pytest.fixture(scope="module")
def make_case(root):
    """name -> HF discriminator + generator saved to disk and imported (built once)."""
    cache = {}

    def make(name):
        if name not in cache:
            disc_sizes, gen_sizes, tied = CASES[name]
            disc = randomize(ElectraForPreTraining(hf_config(**disc_sizes)), seed=1)
            gen = randomize(ElectraForMaskedLM(hf_config(**{**disc_sizes, **gen_sizes})), seed=2)
            if tied:
                gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
            base = root / name
            # base2 carries its vocabulary as transformers 5 saves it: tokenizer.json only
            vocab = "json" if name == "base2" else "txt"
            disc_dir = save_hf(disc, base / "discriminator", vocab)
            gen_dir = save_hf(gen, base / "generator", vocab)
            result = from_hf(disc_dir, gen_dir, out_dir=base / "imported")
            cache[name] = dict(name=name, disc_dir=disc_dir, gen_dir=gen_dir, result=result,
                               tied=tied, out=base / "imported")
        return cache[name]

    return make


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, make_case):
    return make_case(request.param)


@pytest.fixture(scope="module")
def tiny(root):
    """A tiny HF discriminator/generator pair (generator size 1/2) for quick checks."""
    disc = randomize(ElectraForPreTraining(hf_config(**TINY)), seed=5)
    gen_sizes = dict(TINY, hidden_size=32, num_attention_heads=1, intermediate_size=64)
    gen = randomize(ElectraForMaskedLM(hf_config(**gen_sizes)), seed=6)
    return save_hf(disc, root / "tiny" / "d"), save_hf(gen, root / "tiny" / "g")


def test_import_refuses_pickled_objects_and_runs_none(tiny, tmp_path):
    """A pytorch_model.bin that would create a file if unpickled: one line naming it."""
    from helpers import CreatesAFile

    marker, disc = tmp_path / "was_run", tmp_path / "d"
    shutil.copytree(tiny[0], disc)
    weights = load_file(disc / "model.safetensors")
    (disc / "model.safetensors").unlink()
    weights["payload"] = CreatesAFile(marker)
    torch.save(weights, disc / "pytorch_model.bin")
    assert_main_error(convert.main, ["import", "--discriminator", disc, "--out",
                                     tmp_path / "imported"],
                      f"checkpoint {disc / 'pytorch_model.bin'} is refused",
                      "nothing in it was run")
    assert not marker.exists() and not (tmp_path / "imported").exists()
    torch.load(disc / "pytorch_model.bin", weights_only=False)  # what the refusal prevented
    assert marker.exists(), "the test's payload does not run: the test proves nothing"


# ------------------------------------------------------------------ numerics vs transformers
@pytest.mark.slow
def test_import_matches_transformers(case, bert):
    model, task = load_fairseq(case["result"].checkpoint, case["out"])
    assert task.cfg._name == "electra" and model.generator is not None
    assert (model.generator.embeddings is model.discriminator.embeddings) == case["tied"]
    assert (model.cfg.embedding_sharing == "untied") == (not case["tied"])

    ids, mask = bert_batch(bert)
    assert not mask.all()  # a padded batch
    fs_ids = FAIRSEQ_INDEX[ids]  # [PAD] -> <pad>, [CLS] -> <s>, ...
    assert fs_ids[~mask].eq(task.source_dictionary.pad()).all()
    hf_disc = ElectraForPreTraining.from_pretrained(case["disc_dir"])
    with torch.no_grad():
        theirs = hf_disc(ids, attention_mask=mask.long(), output_hidden_states=True)
        logits, extra = model(fs_ids, return_all_hiddens=True)
    assert_close(logits[mask], theirs.logits[mask])
    assert len(extra["inner_states"]) == len(theirs.hidden_states) == model.cfg.num_layers + 1
    for ours_h, their_h in zip(extra["inner_states"], theirs.hidden_states):
        assert_close(ours_h[mask], their_h[mask])

    # generator: every third real token masked; vocabulary logits there, in vocab.txt order
    picked = mask.clone()
    picked[:, 0] = False
    picked &= (torch.arange(ids.size(1)) % 3 == 1)
    picked &= ids.ne(VOCAB.index("[SEP]"))
    hf_gen = ElectraForMaskedLM.from_pretrained(case["gen_dir"])
    depth = hf_gen.config.num_hidden_layers
    assert len(model.generator.encoder.layer) == depth
    assert model.cfg.generator_layers == (None if depth == model.cfg.num_layers
                                          else depth / model.cfg.num_layers)
    masked = ids.masked_fill(picked, MASK_ID)
    with torch.no_grad():
        theirs = hf_gen(masked, attention_mask=mask.long(), output_hidden_states=True)
        hidden, states = model.generator(FAIRSEQ_INDEX[masked], return_all_hiddens=True)
        gen_logits = model.generator_head(hidden[picked])
    assert FAIRSEQ_INDEX[MASK_ID] == task.mask_idx
    assert_close(gen_logits[:, FAIRSEQ_INDEX], theirs.logits[picked])
    for ours_h, their_h in zip(states, theirs.hidden_states):
        assert_close(ours_h[mask], their_h[mask])


@pytest.mark.slow
def test_export_reproduces_transformers_files_bit_for_bit(case, bert, tmp_path):
    out = tmp_path / "hf"
    result = to_hf(case["result"].checkpoint, out)
    assert result.architecture == "ElectraForPreTraining" and result.wordpiece_vocab
    for original, exported, cls in ((case["disc_dir"], out, ElectraForPreTraining),
                                    (case["gen_dir"], out / "generator", ElectraForMaskedLM)):
        theirs, ours = load_file(original / "model.safetensors"), load_file(
            exported / "model.safetensors")
        assert sorted(theirs) == sorted(ours)
        for key in theirs:
            assert theirs[key].dtype == ours[key].dtype and torch.equal(theirs[key], ours[key]), key
        their_cfg = json.loads((original / "config.json").read_text())
        assert json.loads((exported / "config.json").read_text()) == their_cfg
        assert (exported / "vocab.txt").read_text().split("\n")[:-1] == VOCAB
        _, info = cls.from_pretrained(exported, output_loading_info=True)
        assert not any(info.values()), info
    if case["name"] == "small":  # the exported tokenizer files load and agree with BERT's
        tok = AutoTokenizer.from_pretrained(out)
        assert tok(TEXTS).input_ids == bert(TEXTS).input_ids


def test_wordpiece_ids_match_bert_tokenizer(make_case, bert):
    """Text encoded for fairseq from the imported directory = BertTokenizer ids, mapped."""
    case = make_case("small")
    tokenizer = load_tokenizer(case["out"])
    _, task = load_fairseq(case["result"].checkpoint, case["out"])
    texts = TEXTS + ["Café déjà vu: naïve résumé, 42 zebras (unknown ☃ chars)!", "[SEP] stays?"]
    for text in texts:
        ours = task.source_dictionary.encode_line(tokenizer.encode_line(text),
                                                  add_if_not_exist=False, append_eos=True)
        theirs = bert(text).input_ids[1:]  # without [CLS]; [SEP] <-> </s>
        # a literal "[SEP]" in text is a real separator for BERT but only <unk> for fairseq
        theirs = [VOCAB.index("[UNK]") if (t == VOCAB.index("[SEP]") and i < len(theirs) - 1)
                  else t for i, t in enumerate(theirs)]
        assert ours.tolist() == FAIRSEQ_INDEX[theirs].tolist(), text


# ------------------------------------------------------------------ other HF classes
def test_sequence_classification_roundtrip(bert, tmp_path):
    sizes = CASES["untied"][0]
    hf = randomize(ElectraForSequenceClassification(hf_config(num_labels=3, **sizes)), seed=3)
    hf_dir = save_hf(hf, tmp_path / "cls")
    result = from_hf(hf_dir, out_dir=tmp_path / "imported", head_name="sst")
    assert result.task == "masked_lm" and result.model_cfg["load_checkpoint_heads"]
    model, _ = load_fairseq(result.checkpoint, tmp_path / "imported")
    assert model.generator is None and list(model.classification_heads) == ["sst"]
    ids, mask = bert_batch(bert)
    hf = ElectraForSequenceClassification.from_pretrained(hf_dir)
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask.long(), output_hidden_states=True)
        ours, extra = model(FAIRSEQ_INDEX[ids], classification_head_name="sst",
                            return_all_hiddens=True)
    assert_close(ours, theirs.logits)
    for ours_h, their_h in zip(extra["inner_states"], theirs.hidden_states):
        assert_close(ours_h[mask], their_h[mask])

    # a config.json that gives num_labels instead of the label names
    bare = Path(shutil.copytree(hf_dir, tmp_path / "bare"))
    config = json.loads((bare / "config.json").read_text())
    del config["id2label"], config["label2id"]
    (bare / "config.json").write_text(json.dumps(dict(config, num_labels=3)))
    bare_result = from_hf(bare, out_dir=tmp_path / "bare_imported", head_name="sst")
    bare_state = load_checkpoint(bare_result.checkpoint)["model"]
    assert bare_state["classification_heads.sst.out_proj.weight"].shape[0] == 3

    out = tmp_path / "exported"
    assert to_hf(result.checkpoint, out).architecture == "ElectraForSequenceClassification"
    theirs, ours = load_file(hf_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(theirs) == sorted(ours) and all(torch.equal(theirs[k], ours[k]) for k in theirs)
    their_cfg = json.loads((hf_dir / "config.json").read_text())
    assert json.loads((out / "config.json").read_text()) == their_cfg
    _, info = ElectraForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info


def test_bare_electra_model_from_pytorch_bin(bert, tmp_path):
    """An ElectraModel (keys without "electra.") saved as pytorch_model.bin, and back."""
    hf = randomize(ElectraModel(hf_config(**TINY)), seed=4)
    hf_dir = save_hf(hf, tmp_path / "base")
    weights = load_file(hf_dir / "model.safetensors")
    (hf_dir / "model.safetensors").unlink()
    torch.save(weights, hf_dir / "pytorch_model.bin")
    result = from_hf(hf_dir, out_dir=tmp_path / "imported")
    model, _ = load_fairseq(result.checkpoint, tmp_path / "imported")
    assert model.discriminator_head is None and model.generator is None
    ids, mask = bert_batch(bert)
    with torch.no_grad():
        theirs = ElectraModel.from_pretrained(hf_dir)(ids, attention_mask=mask.long())
        ours, _ = model(FAIRSEQ_INDEX[ids], features_only=True)
    assert_close(ours[mask], theirs.last_hidden_state[mask])
    out = tmp_path / "exported"
    assert to_hf(result.checkpoint, out).architecture == "ElectraModel"
    exported = load_file(out / "model.safetensors")
    assert sorted(exported) == sorted(weights)
    assert all(torch.equal(exported[k], weights[k]) for k in weights)
    _, info = ElectraModel.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info


def test_export_without_wordpiece_vocab_keeps_fairseq_order(tiny, tmp_path):
    """A dictionary not made from a vocab.txt (e.g. sentencepiece): ids are fairseq's."""
    imported = from_hf(tiny[0], out_dir=tmp_path / "imported")
    data = tmp_path / "spm_data"
    data.mkdir()
    shutil.copy(tmp_path / "imported" / "dict.txt", data / "dict.txt")  # no vocab.txt beside it
    out = tmp_path / "hf"
    result = to_hf(imported.checkpoint, out, data=data)
    assert not result.wordpiece_vocab and result.architecture == "ElectraForPreTraining"
    assert not (out / "vocab.txt").exists()
    assert (out / "dict.txt").read_text() == (data / "dict.txt").read_text()
    assert "fairseq dictionary" in (out / "VOCABULARY.md").read_text()
    config = json.loads((out / "config.json").read_text())
    assert config["pad_token_id"] == 1
    ours = load_checkpoint(imported.checkpoint)["model"]
    exported = load_file(out / "model.safetensors")
    assert torch.equal(exported["electra.embeddings.word_embeddings.weight"],
                       ours["discriminator.embeddings.word_embeddings.weight"])
    _, info = ElectraForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    # with the vocab.txt named explicitly the rows go back into vocab.txt order
    to_hf(imported.checkpoint, tmp_path / "hf2", data=data, vocab=tiny[0] / "vocab.txt")
    again = load_file(tmp_path / "hf2" / "model.safetensors")
    assert torch.equal(again["electra.embeddings.word_embeddings.weight"],
                       load_file(tiny[0] / "model.safetensors")[
                           "electra.embeddings.word_embeddings.weight"])


def test_export_without_token_types_adds_a_zero_row(tiny, bert, tmp_path):
    imported = from_hf(tiny[0], out_dir=tmp_path / "imported")
    state = load_checkpoint(imported.checkpoint)
    weights = {k: v for k, v in state["model"].items() if "token_type" not in k}
    model_cfg = OmegaConf.merge(state["cfg"].model, {"type_vocab_size": 0})
    path = tmp_path / "imported" / "no_types.pt"
    write_checkpoint(path, model_cfg, state["cfg"].task, weights)
    model, _ = load_fairseq(path, tmp_path / "imported")
    to_hf(path, tmp_path / "hf")
    hf = ElectraForPreTraining.from_pretrained(tmp_path / "hf")
    assert hf.config.type_vocab_size == 1
    assert not hf.electra.embeddings.token_type_embeddings.weight.any()
    ids, mask = bert_batch(bert)
    with torch.no_grad():  # (the masked_lm task builds the discriminator without its head)
        theirs = hf(ids, attention_mask=mask.long(), output_hidden_states=True)
        assert_close(model(FAIRSEQ_INDEX[ids], features_only=True)[0][mask],
                     theirs.hidden_states[-1][mask])


# ------------------------------------------------------------------ fairseq accepts the files
def binarize(tokenizer_dir, dest):
    """English text -> WordPiece pieces (the imported tokenizer) -> fairseq binary data."""
    tokenizer = load_tokenizer(tokenizer_dir)
    dest.mkdir()
    lines = [tokenizer.encode_line(t) for t in TEXTS]
    (dest / "train.txt").write_text("\n".join(lines * 8) + "\n")
    (dest / "valid.txt").write_text("\n".join(lines) + "\n")
    args = options.get_preprocessing_parser().parse_args([
        "--only-source", "--srcdict", str(tokenizer_dir / "dict.txt"), "--workers", "1",
        "--trainpref", str(dest / "train.txt"), "--validpref", str(dest / "valid.txt"),
        "--destdir", str(dest / "bin")])
    preprocess.main(args)
    return dest / "bin"


@pytest.mark.slow
@pytest.mark.parametrize("name,start", [
    ("small", ["--restore-file", "{ckpt}", "--reset-optimizer", "--reset-dataloader",
               "--reset-meters"]),
    ("untied", ["--finetune-from-model", "{ckpt}"]),
    ("shallow", ["--finetune-from-model", "{ckpt}"]),  # --generator-layers from the import
])
def test_continue_pretraining_with_fairseq_train(make_case, tmp_path, name, start):
    case = make_case(name)
    data = binarize(case["out"], tmp_path / "data")
    checkpoint = case["result"].checkpoint
    proc = train_from_model_cfg(data, tmp_path / "ck", case["result"].model_cfg,
                 *[arg.format(ckpt=checkpoint) for arg in start])
    assert_one_update_from(proc, tmp_path / "ck", checkpoint)
    # and what fairseq-train saved exports again (data/bin has dict.txt but no vocab.txt)
    out = tmp_path / "hf"
    to_hf(tmp_path / "ck" / "checkpoint_last.pt", out, vocab=case["out"] / "vocab.txt")
    _, info = ElectraForMaskedLM.from_pretrained(out / "generator", output_loading_info=True)
    assert not any(info.values()), info


@pytest.mark.slow
def test_gdes_run_exports_a_plain_discriminator(tiny, bert, tmp_path):
    """fairseq-train with --embedding-sharing gdes: transformers, the hub interface and
    electra-extract see one token table, the generator's plus the residual."""
    imported = from_hf(tiny[0], tiny[1], out_dir=tmp_path / "imported")
    data = binarize(tmp_path / "imported", tmp_path / "data")
    # from scratch (tiny's two embedding blocks differ: the import unties them); lr 1e-2:
    # one Adam update moves the residual about as far as the embeddings' own scale
    proc = train_from_model_cfg(data, tmp_path / "ck", dict(imported.model_cfg, embedding_sharing=None),
                 "--embedding-sharing", "gdes", "--lr", "1e-2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    checkpoint = tmp_path / "ck" / "checkpoint_last.pt"
    weights = load_checkpoint(checkpoint)["model"]
    assert weights[GDES_DELTA].abs().max() > 5e-3
    folded = weights["generator.embeddings.word_embeddings.weight"] + weights[GDES_DELTA]

    out = tmp_path / "hf"
    to_hf(checkpoint, out, vocab=tmp_path / "imported" / "vocab.txt")
    exported = load_file(out / "model.safetensors")
    assert torch.equal(exported["electra.embeddings.word_embeddings.weight"],
                       folded[FAIRSEQ_INDEX])
    theirs, info = ElectraForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    _, info = ElectraForMaskedLM.from_pretrained(out / "generator", output_loading_info=True)
    assert not any(info.values()), info
    model, _ = load_fairseq(checkpoint, tmp_path / "imported")
    assert isinstance(model.discriminator.embeddings.word_embeddings, DisentangledEmbedding)
    ids, mask = bert_batch(bert)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask.long()).logits
        logits, _ = model(FAIRSEQ_INDEX[ids])
    assert_close(logits[mask], expected[mask])

    electra = hub(str(tmp_path / "ck"), "checkpoint_last.pt", str(tmp_path / "imported"))
    single = bert(TEXTS[0], return_tensors="pt").input_ids
    assert electra.encode(TEXTS[0]).tolist() == FAIRSEQ_INDEX[single[0]].tolist()
    with torch.no_grad():
        probs = torch.sigmoid(theirs(single).logits[0, 1:-1])
    scores = torch.tensor([score for _, score in electra.replaced_token_scores(TEXTS[0])])
    assert_close(scores, probs)

    disc = tmp_path / "disc.pt"
    proc = run([sys.executable, "-m", "electra_plugin.cli.extract", checkpoint,
                "--out", disc])
    assert proc.returncode == 0, proc.stderr[-3000:]
    disc = torch.load(disc, weights_only=False)["model"]
    assert GDES_DELTA not in disc
    assert torch.equal(disc["discriminator.embeddings.word_embeddings.weight"], folded)


# ------------------------------------------------------------------ sentence pairs
def test_imported_model_gives_pairs_berts_token_types(tiny, bert, tmp_path):
    """HF ELECTRA was pre-trained with type 1 on the second segment: a pair given without
    token types (as sentence_prediction gives it) gets BertTokenizer's token_type_ids."""
    result = from_hf(tiny[0], out_dir=tmp_path / "imported")
    assert result.model_cfg["segment_token_types"]
    assert "--segment-token-types" in result.cli_args
    model, _ = load_fairseq(result.checkpoint, tmp_path / "imported")
    batch = bert(TEXTS[:2], TEXTS[2:], padding=True, return_tensors="pt")
    ids, mask, types = batch.input_ids, batch.attention_mask.bool(), batch.token_type_ids
    assert types[mask].any() and not mask.all()  # padded pairs
    hf = ElectraForPreTraining.from_pretrained(tiny[0])
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask.long(), token_type_ids=types,
                    output_hidden_states=True)
        ours, _ = model(FAIRSEQ_INDEX[ids], features_only=True)
    assert_close(ours[mask], theirs.hidden_states[-1][mask])


@pytest.mark.slow
def test_finetuning_an_imported_model_keeps_its_token_types(tiny, tmp_path):
    """fairseq-train sentence_prediction with the imported model's options (model_cli_args)
    and --restore-file: the fine-tuned checkpoint keeps the setting, and its pairs
    <s> A </s> B </s> (electra-glue preprocess) get type 1 on B </s>."""
    from helpers import preprocess, write_rte  # this module's preprocess is fairseq's


    imported = from_hf(tiny[0], out_dir=tmp_path / "imported")
    data = tmp_path / "rte-bin"
    proc = preprocess("RTE", write_rte(tmp_path / "RTE", 8, 4), tmp_path / "imported", data,
                      "--max-seq-len", "64")
    assert proc.returncode == 0, proc.stderr[-3000:]
    save = tmp_path / "ft"
    proc = run_here([sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN,
                     "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                     *model_cli_args(imported.model_cfg), "--cpu", "--num-classes", "2",
                     "--init-token", "0", "--max-positions", "64",
                     "--restore-file", imported.checkpoint, "--reset-optimizer",
                     "--reset-dataloader", "--reset-meters", "--optimizer", "adam", "--lr", "1e-5",
                     "--batch-size", "4", "--max-update", "1", "--save-dir", save,
                     "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0",
                     "--data-buffer-size", "0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    model, task = load_fairseq(save / "checkpoint_last.pt", data)
    assert model.cfg.segment_token_types
    task.load_dataset("valid")
    dataset = task.datasets["valid"]
    sample = dataset.collater([dataset[i] for i in range(len(dataset))])
    tokens = sample["net_input"]["src_tokens"]
    # segment A: <s> + input0 (which ends with </s>); B: input1 (B </s>)
    input0 = [len(x) for x in fairseq_split(data / "input0", "valid", task.source_dictionary)]
    types = torch.zeros_like(tokens)
    for row, length in enumerate(input0):
        types[row, 1 + length:] = 1
    types.masked_fill_(tokens.eq(task.source_dictionary.pad()), 0)
    assert types.any()
    with torch.no_grad():
        ours, _ = model(tokens, classification_head_name="sentence_classification_head")
        given, _ = model(tokens, classification_head_name="sentence_classification_head",
                         token_types=types)
        zeros, _ = model(tokens, classification_head_name="sentence_classification_head",
                         token_types=torch.zeros_like(tokens))
    assert_close(ours, given)
    assert not torch.allclose(ours, zeros, atol=1e-4)


def fairseq_split(directory, split, dictionary):
    from fairseq.data import data_utils

    return data_utils.load_indexed_dataset(str(directory / split), dictionary)


# ------------------------------------------------------------------ checkpoint module
def test_checkpoint_writer_and_reader(make_case, tmp_path):
    case = make_case("small")
    state = load_checkpoint(case["result"].checkpoint)
    cfg = state["cfg"]
    for group in ("common", "dataset", "optimization", "checkpoint", "distributed_training",
                  "model", "task", "criterion"):
        assert cfg[group] is not None, group
    assert cfg.task.seed == cfg.common.seed  # interpolation resolved like the trainer does
    path = tmp_path / "copy.pt"
    write_checkpoint(path, cfg.model, cfg.task, state["model"])
    with pytest.raises(ElectraUsageError) as e:
        write_checkpoint(path, cfg.model, cfg.task, state["model"])
    one_line_error(e, "already exists")
    write_checkpoint(path, cfg.model, cfg.task, state["model"], overwrite=True)
    assert load_checkpoint(path)["model"].keys() == state["model"].keys()

    with pytest.raises(ElectraUsageError) as e:
        load_checkpoint(tmp_path / "missing.pt")
    one_line_error(e, "does not exist")
    (tmp_path / "text.pt").write_text("not a checkpoint\n")
    with pytest.raises(ElectraUsageError) as e:
        load_checkpoint(tmp_path / "text.pt")
    one_line_error(e, "is not a checkpoint: it is a text file")
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(ElectraUsageError) as e:
        load_checkpoint(tmp_path / "tensor.pt")
    one_line_error(e, "not a fairseq checkpoint")
    lm_cfg = build_fairseq_config({"_name": "transformer_lm"},
                                  {"_name": "language_modeling", "data": "x"})
    torch.save({"cfg": OmegaConf.to_container(lm_cfg, resolve=True, enum_to_str=True),
                "model": {"decoder.embed_tokens.weight": torch.zeros(2, 2)}},
               tmp_path / "lm.pt")
    with pytest.raises(ElectraUsageError) as e:
        load_checkpoint(tmp_path / "lm.pt")
    one_line_error(e, "not an ELECTRA checkpoint", "transformer_lm")


def test_import_takes_a_cased_tokenizer_json(tiny, tmp_path):
    """A directory with the vocabulary only in tokenizer.json keeps its normaliser's settings."""
    disc = Path(shutil.copytree(tiny[0], tmp_path / "d"))
    (disc / "vocab.txt").rename(tmp_path / "vocab.txt")
    BertTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=False,
                  tokenize_chinese_chars=False).save_pretrained(disc)
    (disc / "tokenizer_config.json").unlink()  # the settings come from tokenizer.json alone
    from_hf(disc, out_dir=tmp_path / "out")
    meta = json.loads((tmp_path / "out" / "electra_tokenizer.json").read_text())
    assert meta["lowercase"] is False and meta["tokenize_chinese_chars"] is False
    assert (tmp_path / "out" / "vocab.txt").read_text().split("\n")[:-1] == VOCAB
    assert load_tokenizer(str(tmp_path / "out")).pieces("The dog") == ["<unk>", "dog"]


# ------------------------------------------------------------------ bad input, one line each
def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def edit_weights(path, fn):
    weights = load_file(path / "model.safetensors")
    fn(weights)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


BAD_DISCRIMINATORS = {
    "bert config": (lambda d: edit_config(d, model_type="bert"), ["'bert' model", "the conversion reads electra, deberta-v2, modernbert"]),
    "relu": (lambda d: edit_config(d, hidden_act="relu"), ["hidden_act 'relu'"]),
    "eps": (lambda d: edit_config(d, layer_norm_eps=1e-5), ["layer_norm_eps"]),
    "no config": (lambda d: (d / "config.json").unlink(), ["no config.json"]),
    "no vocab": (lambda d: (d / "vocab.txt").unlink(), ["no vocab.txt"]),
    "bad tokenizer.json": (lambda d: ((d / "vocab.txt").unlink(),
                                      (d / "tokenizer.json").write_text('{"model": 3}')),
                           ["cannot read", "tokenizer.json"]),
    "vocab size": (lambda d: edit_config(d, vocab_size=len(VOCAB) + 1), ["vocab_size"]),
    "missing tensor": (
        lambda d: edit_weights(d, lambda w: w.pop("electra.encoder.layer.1.output.dense.bias")),
        ["1 missing: electra.encoder.layer.1.output.dense.bias"]),
    "extra tensor": (
        lambda d: edit_weights(d, lambda w: w.update(
            {"electra.encoder.layer.2.output.dense.bias": torch.zeros(64)})),
        ["1 unexpected: electra.encoder.layer.2.output.dense.bias"]),
    "wrong shape": (lambda d: edit_config(d, intermediate_size=96),
                    ["wrongly shaped", "intermediate.dense.weight [128, 64] (expected [96, 64])"]),
    "causal LM": (lambda d: edit_config(d, architectures=["ElectraForCausalLM"]),
                  ["ElectraForCausalLM is not supported"]),
}
BAD_GENERATORS = {
    "heads": (lambda g: edit_config(g, num_attention_heads=2), ["does not fit", "32-dim heads"]),
    "layers": (lambda g: edit_config(g, num_hidden_layers=3),
               ["num_hidden_layers 3 is not between 1 and the discriminator's 2"]),
    "ffn": (lambda g: edit_config(g, intermediate_size=96), ["intermediate_size 96 should be 64"]),
    "untied output": (lambda g: edit_weights(g, lambda w: w.update({
        "generator_lm_head.weight": w["electra.embeddings.word_embeddings.weight"] + 1})),
        ["generator_lm_head.weight differs"]),
}


@pytest.mark.parametrize("bad", sorted(BAD_DISCRIMINATORS))
def test_bad_discriminator_dir(tiny, tmp_path, bad):
    disc = Path(shutil.copytree(tiny[0], tmp_path / "d"))
    breaker, phrases = BAD_DISCRIMINATORS[bad]
    breaker(disc)
    with pytest.raises(ElectraUsageError) as e:
        from_hf(disc, out_dir=tmp_path / "out")
    one_line_error(e, *phrases)
    assert not (tmp_path / "out").exists()  # nothing half-written


@pytest.mark.parametrize("bad", sorted(BAD_GENERATORS))
def test_bad_generator_dir(tiny, tmp_path, bad):
    gen = Path(shutil.copytree(tiny[1], tmp_path / "g"))
    breaker, phrases = BAD_GENERATORS[bad]
    breaker(gen)
    with pytest.raises(ElectraUsageError) as e:
        from_hf(tiny[0], gen, out_dir=tmp_path / "out")
    one_line_error(e, *phrases)


def test_bad_paths_and_targets(tiny, tmp_path):
    with pytest.raises(ElectraUsageError) as e:
        from_hf(tmp_path / "nowhere", out_dir=tmp_path / "out")
    one_line_error(e, "is not a directory")
    with pytest.raises(ElectraUsageError) as e:  # generator given as the discriminator
        from_hf(tiny[1], out_dir=tmp_path / "out")
    one_line_error(e, "is a generator")

    imported = from_hf(tiny[0], tiny[1], out_dir=tmp_path / "imported")
    with pytest.raises(ElectraUsageError) as e:  # import into a directory with files
        from_hf(tiny[0], out_dir=tmp_path / "imported")
    one_line_error(e, "already holds files")
    target = tmp_path / "hf"
    target.mkdir()
    (target / "notes.txt").write_text("mine\n")
    with pytest.raises(ElectraUsageError) as e:
        to_hf(imported.checkpoint, target)
    one_line_error(e, "already holds files", "notes.txt")
    to_hf(imported.checkpoint, target, overwrite=True)
    assert (target / "notes.txt").exists() and (target / "generator" / "config.json").exists()
    with pytest.raises(ElectraUsageError) as e:
        to_hf(imported.checkpoint, tmp_path / "hf2", data=tmp_path)
    one_line_error(e, "dict.txt is missing")
    other_vocab = tmp_path / "other_vocab.txt"
    other_vocab.write_text("\n".join(VOCAB[:-2] + VOCAB[-1:] + VOCAB[-2:-1]) + "\n")
    with pytest.raises(ElectraUsageError) as e:  # same size, two rows swapped
        to_hf(imported.checkpoint, tmp_path / "hf2", vocab=other_vocab)
    one_line_error(e, f"vocab.txt line {len(VOCAB) - 1}", "not made from this vocab.txt")


def test_several_heads_need_a_choice(tiny, tmp_path):
    imported = from_hf(tiny[0], out_dir=tmp_path / "imported")
    state = load_checkpoint(imported.checkpoint)
    weights = dict(state["model"])
    for name, classes in (("mnli", 3), ("sst", 2)):
        weights[f"classification_heads.{name}.dense.weight"] = torch.randn(64, 64)
        weights[f"classification_heads.{name}.dense.bias"] = torch.randn(64)
        weights[f"classification_heads.{name}.out_proj.weight"] = torch.randn(classes, 64)
        weights[f"classification_heads.{name}.out_proj.bias"] = torch.randn(classes)
    # a span head in a sentence_prediction checkpoint is no head of its task: left out
    weights["classification_heads.squad.out_proj.weight"] = torch.randn(2, 64)
    weights["classification_heads.squad.out_proj.bias"] = torch.randn(2)
    path = tmp_path / "heads.pt"
    write_checkpoint(path, state["cfg"].model, state["cfg"].task, weights)
    with pytest.raises(ElectraUsageError) as e:
        to_hf(path, tmp_path / "hf")
    one_line_error(e, "heads mnli, sst;", "pick one")
    with pytest.raises(ElectraUsageError) as e:
        to_hf(path, tmp_path / "hf", head="squad")
    one_line_error(e, "'squad'", "is not a sentence_prediction head")
    with pytest.raises(ElectraUsageError) as e:
        to_hf(path, tmp_path / "hf", head="qnli")
    one_line_error(e, "no classification head 'qnli'")
    to_hf(path, tmp_path / "hf", head="sst")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["ElectraForSequenceClassification"]
    assert ElectraConfig.from_pretrained(tmp_path / "hf").num_labels == 2


def test_key_table_is_one_to_one():
    """Within each HF class (a sentence head and a token head share fairseq's names, as the
    model's heads do, and go to different classes)."""
    for architecture, components in HF_ARCHITECTURES.items():
        for side in ("fairseq", "hf"):
            names = [getattr(row, side) for row in KEY_TABLE if row.component in components]
            assert len(names) == len(set(names)), (architecture, side)


def test_key_table_renames_both_ways_strictly():
    fields = dict(num_layers=2, hidden_size=8, num_heads=2, ffn_size=16, embedding_size=4,
                  max_positions=6, type_vocab_size=2)
    components = ("discriminator", "discriminator_head")
    params = expand(components, {c: symbols(fields, 7) for c in components})
    ours = {p.fairseq: torch.randn(p.shape) for p in params}
    theirs = rename(ours, params, to_hf=True, where="x")
    assert theirs["electra.embeddings_project.weight"] is ours[
        "discriminator.embeddings_project.weight"]  # E != H: the projection is there
    order = torch.tensor([3, 0, 6, 1, 5, 2, 4])  # vocab row i -> fairseq row order[i]
    permute_rows(theirs, params, to_hf=True, fairseq_index=order)
    assert torch.equal(theirs["electra.embeddings.word_embeddings.weight"],
                       ours["discriminator.embeddings.word_embeddings.weight"][order])
    back = rename(theirs, params, to_hf=False, where="x")
    permute_rows(back, params, to_hf=False, fairseq_index=order)
    assert back.keys() == ours.keys() and all(torch.equal(back[k], ours[k]) for k in ours)
    key = "discriminator.encoder.layer.1.output.dense.bias"
    cases = [({k: v for k, v in ours.items() if k != key}, f"1 missing: {key}"),
             ({**ours, "discriminator.extra": torch.zeros(1)}, "1 unexpected: discriminator.extra"),
             ({**ours, key: torch.zeros(9)}, f"1 wrongly shaped: {key} [9] (expected [8])")]
    for state, phrase in cases:
        with pytest.raises(ElectraUsageError) as e:
            rename(state, params, to_hf=True, where="ck.pt")
        one_line_error(e, "ck.pt: weights do not match the config", phrase)
    with pytest.raises(ElectraUsageError) as e:
        component_of("decoder.layers.0.weight")
    one_line_error(e, "decoder.layers.0.weight belongs to no ELECTRA component")


# ------------------------------------------------------------------ command line
def test_command_line(tiny, tmp_path):
    convert.main(["import", "--discriminator", str(tiny[0]), "--generator", str(tiny[1]),
              "--out", str(tmp_path / "imported")])
    convert.main(["export", str(tmp_path / "imported" / "checkpoint.pt"),
              "--out", str(tmp_path / "hf")])
    _, info = ElectraForMaskedLM.from_pretrained(tmp_path / "hf" / "generator",
                                                 output_loading_info=True)
    assert not any(info.values())
    # a second export into the same --out is refused (the one-line command-line edge of
    # this error is test_errors.py's test_command_lines_turn_it_into_one_line)
    assert_main_error(convert.main, ["export", tmp_path / "imported" / "checkpoint.pt",
                                     "--out", tmp_path / "hf"], "already holds files")
