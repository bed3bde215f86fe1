"""Released DeBERTa-v3 and ModernBERT checkpoints pad the embedding table beyond their
tokenizers (128,100 rows for 128,001 tokens, 50,368 for 50,285): import keeps every row, the
extra ones as placeholder tokens no text produces, export gives the table back, and
pre-training continues from the import. Tokenizers of the released sizes, built in code;
models of those vocabulary sizes with tiny layers and random weights."""

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from fairseq.data import Dictionary, data_utils  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from electra_plugin.convert import from_hf, to_hf  # noqa: E402
from electra_plugin.data import tokenizer as tokmod  # noqa: E402
from electra_plugin.user_io.errors import ElectraUsageError  # noqa: E402
from conversion_helpers import LETTERS, TEXTS, WORDS, hf_model, load_fairseq  # noqa: E402
from helpers import run, train_from_model_cfg  # noqa: E402

# (embedding rows, tokenizer tokens) of microsoft/deberta-v3-base and answerdotai/ModernBERT-base
RELEASED = {"deberta": (128_100, 128_001), "modern": (50_368, 50_285)}
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64)
PUNCTUATION = list(".,!?;'-")


def deberta_v3_tokenizer(path):
    """DeBERTa-v3's layout: a sentencepiece Unigram of 128,000 pieces, [PAD] [CLS] [SEP] [UNK]
    first, and [MASK] added after them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    characters = LETTERS + [c.upper() for c in LETTERS] + PUNCTUATION + list("0123456789")
    real = ["▁"] + ["▁" + w for w in WORDS] + ["▁" + c for c in characters] + characters
    pieces = [(t, 0.0) for t in ("[PAD]", "[CLS]", "[SEP]", "[UNK]")] + \
        [(p, -5.0 - len(p) * 0.1) for p in dict.fromkeys(real)]
    pieces += [(f"▁piece{i}", -15.0) for i in range(RELEASED["deberta"][1] - 1 - len(pieces))]
    tok = Tokenizer(models.Unigram(pieces, unk_id=3, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", cls_token="[CLS]",
                                 sep_token="[SEP]", unk_token="[UNK]", mask_token="[MASK]")
    hf.save_pretrained(path)
    return hf


def modernbert_tokenizer(path):
    """ModernBERT's layout: a byte-level BPE of 50,285 tokens ending in [UNK] [CLS] [SEP]
    [PAD] [MASK] (merges trained on the test texts, the rest of the table filled)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS * 4, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    filled = RELEASED["modern"][1] - len(specials)
    vocab.update((f"Ġtoken{i}", i) for i in range(len(vocab), filled))
    vocab.update((name, filled + i) for i, name in enumerate(specials))
    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                 **dict(zip(("unk_token", "cls_token", "sep_token", "pad_token",
                                             "mask_token"), specials)))
    hf.save_pretrained(path)
    return hf


TOKENIZERS = {"deberta": deberta_v3_tokenizer, "modern": modernbert_tokenizer}


def released_pair(body, root):
    """An HF discriminator and generator (tied embeddings) of the released vocabulary shape,
    each directory with the tokenizer: (tokenizer, discriminator, generator, their dirs)."""
    rows, tokens = RELEASED[body]
    tok = TOKENIZERS[body](root / "d")
    assert len(tok) == tokens
    ids = dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id,
               cls_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
               sep_token_id=tok.sep_token_id)
    disc = hf_model(body, "Model", seed=1, vocab_size=rows, **TINY, **ids)
    gen = hf_model(body, "ForMaskedLM", seed=2, vocab_size=rows, **dict(TINY, num_hidden_layers=1),
                   **ids)
    getattr(gen, gen.base_model_prefix).embeddings.load_state_dict(disc.embeddings.state_dict())
    disc.save_pretrained(root / "d")
    gen.save_pretrained(root / "g")
    tok.save_pretrained(root / "g")
    return tok, disc, gen, root / "d", root / "g"


def word_embeddings(model):
    return model.get_input_embeddings().weight


@pytest.mark.slow  # DeBERTa-v3's 128,000 pieces take seconds to build, save and load
@pytest.mark.parametrize("body", ["deberta", "modern"])
def test_released_vocabulary_sizes_import_with_every_row_and_export_back(body, tmp_path):
    rows, tokens = RELEASED[body]
    tok, disc, gen, disc_dir, gen_dir = released_pair(body, tmp_path)
    result = from_hf(disc_dir, gen_dir, out_dir=tmp_path / "imported")
    model, task = load_fairseq(result.checkpoint, tmp_path / "imported")
    d = task.source_dictionary
    table = model.discriminator.embeddings.word_embeddings.weight
    assert len(d) == table.size(0) == rows and d.symbols[-1] == "<mask>"
    # the placeholders: fairseq's names, just before <mask>, none a token of the tokenizer
    padding = d.symbols[rows - 1 - (rows - tokens):rows - 1]
    assert padding == [f"madeupword{i:04d}" for i in range(rows - tokens)]
    assert not set(padding) & set(tok.get_vocab())
    # every HF row is kept: the tokens' rows where their ids lead, the extra rows in order
    order = torch.tensor(json.loads((tmp_path / "imported" / "hf_order.json").read_text())[
        "fairseq_row_of_hf_id"])
    hf_table = word_embeddings(disc)
    assert torch.equal(table[order], hf_table)
    assert torch.equal(table[[d.index(p) for p in padding]], hf_table[tokens:])
    # text reads the same rows through either tokenizer, and never a placeholder
    plugin = tokmod.load_tokenizer(str(tmp_path / "imported"))
    for text in TEXTS + [" ".join(padding[:3]), "madeupword0000madeupword0001"]:
        theirs = tok(text, add_special_tokens=False).input_ids
        ours = [d.index(p) for p in plugin.pieces(text)]
        assert torch.equal(table[ours], hf_table[theirs]), text
        assert not set(ours) & {d.index(p) for p in padding}, text
    theirs = [tok.cls_token_id] + tok(TEXTS[3], add_special_tokens=False).input_ids + \
        [tok.sep_token_id]
    ours = [0] + [d.index(p) for p in plugin.pieces(TEXTS[3])] + [2]
    with torch.no_grad():
        features, _ = model.discriminator(torch.tensor([ours]))
        torch.testing.assert_close(features, disc(torch.tensor([theirs])).last_hidden_state,
                                   atol=1e-5, rtol=0)

    # export: the released shapes, every tensor and the tokenizer back
    exported = to_hf(result.checkpoint, tmp_path / "hf")
    for original, written in ((disc_dir, tmp_path / "hf"), (gen_dir, Path(exported.generator_dir))):
        assert json.loads((written / "config.json").read_text())["vocab_size"] == rows
        theirs, ours = load_file(original / "model.safetensors"), load_file(
            written / "model.safetensors")
        assert sorted(theirs) == sorted(ours)
        assert all(torch.equal(theirs[k], ours[k]) for k in theirs)
        assert (written / "tokenizer.json").read_bytes() == \
            (original / "tokenizer.json").read_bytes()


def test_wordpiece_vocabulary_keeps_padded_rows_in_brackets(tmp_path):
    """A vocab.txt checkpoint whose table has more rows: bracketed placeholders, which
    BERT's pre-tokenizer splits, in vocab.txt and dict.txt."""
    from conversion_helpers import VOCAB, save_hf

    model = hf_model("deberta", "Model", seed=3, vocab_size=len(VOCAB) + 5, **TINY)
    hf_dir = save_hf(model, tmp_path / "hf")
    result = from_hf(hf_dir, out_dir=tmp_path / "imported")
    imported, task = load_fairseq(result.checkpoint, tmp_path / "imported")
    d = task.source_dictionary
    names = [f"[madeupword{i:04d}]" for i in range(5)]
    assert len(d) == len(VOCAB) + 5 and d.symbols[-6:-1] == names
    vocab = (tmp_path / "imported" / "vocab.txt").read_text().split("\n")[:-1]
    assert vocab == VOCAB + names
    assert torch.equal(imported.discriminator.embeddings.word_embeddings.weight[
        [d.index(n) for n in names]], word_embeddings(model)[len(VOCAB):])
    plugin = tokmod.load_tokenizer(str(tmp_path / "imported"))
    assert not set(plugin.pieces(" ".join(names))) & set(names)
    assert to_hf(result.checkpoint, tmp_path / "back")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["vocab_size"] == \
        len(VOCAB) + 5


def test_fewer_rows_than_tokens_is_refused_in_one_line(tmp_path):
    from conversion_helpers import VOCAB, save_hf

    model = hf_model("modern", "Model", seed=4, vocab_size=len(VOCAB) - 1, **TINY)
    with pytest.raises(ElectraUsageError) as error:
        from_hf(save_hf(model, tmp_path / "hf"), out_dir=tmp_path / "imported")
    message = str(error.value)
    assert f"vocab_size {len(VOCAB) - 1}, fewer than the {len(VOCAB)} tokens" in message
    assert "\n" not in message
    assert not (tmp_path / "imported").exists()


def test_placeholders_the_tokenizer_would_produce_are_refused():
    """A Unigram vocabulary without digits would take the piece madeupword0000 for that text
    (the lattice prefers one very unlikely piece to unknown characters): refused."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from electra_plugin.data.fast_tokenizer import renumbered

    pieces = [(t, 0.0) for t in ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]", "▁")] + \
        [(c, -5.0) for c in LETTERS]
    tok = Tokenizer(models.Unigram(pieces, unk_id=3, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    renumbered(tok, [1, 0, 2, 3, 4], padding=["madeupword"])  # every character a piece
    with pytest.raises(ElectraUsageError) as error:
        renumbered(tok, [1, 0, 2, 3, 4], padding=["madeupword0000", "madeupword0001"])
    assert "'madeupword0000' would give the placeholder" in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize("body", ["deberta", "modern"])
def test_continue_pretraining_a_padded_import(body, tmp_path):
    """electra-prepare --tokenizer-from the import, then a few fairseq-train updates from it:
    the data never holds a placeholder, the table keeps its rows."""
    rows, tokens = RELEASED[body]
    _, _, _, disc_dir, gen_dir = released_pair(body, tmp_path)
    result = from_hf(disc_dir, gen_dir, out_dir=tmp_path / "imported")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS * 4 + [""] + TEXTS[::-1] * 4) + "\n", encoding="utf-8")
    proc = run([sys.executable, "-m", "electra_plugin.cli.prepare", "--train", corpus,
                "--destdir", tmp_path / "data", "--tokenizer-from", tmp_path / "imported",
                "--workers", "1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = Dictionary.load(str(tmp_path / "data" / "dict.txt"))
    data = data_utils.load_indexed_dataset(str(tmp_path / "data" / "train"), d)
    used = torch.cat([data[i] for i in range(len(data))])
    assert used.max() < len(d) - (rows - tokens)  # no placeholder (they end dict.txt)
    proc = train_from_model_cfg(tmp_path / "data", tmp_path / "ck", result.model_cfg,
                                "--restore-file", result.checkpoint, "--reset-optimizer",
                                "--reset-dataloader", "--reset-meters", "--max-update", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Loaded checkpoint" in proc.stderr + proc.stdout
    after = torch.load(tmp_path / "ck" / "checkpoint_last.pt", map_location="cpu")
    assert after["optimizer_history"][-1]["num_updates"] == 3
    assert after["model"]["discriminator.embeddings.word_embeddings.weight"].size(0) == rows
