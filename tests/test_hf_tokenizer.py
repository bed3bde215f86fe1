"""tokenizer.json in fairseq ids: the same ids as the plugin's encoder, byte-identical
binarizing, and sentencepiece models that work in transformers after export."""

import json
import random
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary, data_utils
from tokenizers import Tokenizer

from electra_plugin.cli import prepare
from electra_plugin.data import documents
from electra_plugin.data import fast_tokenizer
from electra_plugin.data import tokenizer as tokmod
from electra_plugin.data.binarize import fairseq_preprocess
from helpers import (
    PLUGIN, VARIED, assert_one_update_from, preprocess, python_docs_paragraphs, run, run_here,
    train_cmd, train_from_model_cfg, vocab_for, write_rte,
)


# Real Korean and Japanese text: articles of the constitutions of the Republic of Korea
# (1987) and of Japan (1946), both public documents.
KOREAN = [
    "대한민국은 민주공화국이다.",
    "대한민국의 주권은 국민에게 있고, 모든 권력은 국민으로부터 나온다.",
    "대한민국의 국민이 되는 요건은 법률로 정한다.",
    "국가는 법률이 정하는 바에 의하여 재외국민을 보호할 의무를 진다.",
    "대한민국의 영토는 한반도와 그 부속도서로 한다.",
    "대한민국은 통일을 지향하며, 자유민주적 기본질서에 입각한 평화적 통일 정책을 수립하고 이를 추진한다.",
    "대한민국은 국제평화의 유지에 노력하고 침략적 전쟁을 부인한다.",
    "공무원은 국민전체에 대한 봉사자이며, 국민에 대하여 책임을 진다.",
    "정당의 설립은 자유이며, 복수정당제는 보장된다.",
    "국가는 전통문화의 계승·발전과 민족문화의 창달에 노력하여야 한다.",
    "모든 국민은 인간으로서의 존엄과 가치를 가지며, 행복을 추구할 권리를 가진다.",
    "모든 국민은 법 앞에 평등하다. 누구든지 성별·종교 또는 사회적 신분에 의하여 차별을 받지 아니한다.",
    "모든 국민은 신체의 자유를 가진다.",
    "모든 국민은 거주·이전의 자유를 가진다.",
    "모든 국민은 직업선택의 자유를 가진다.",
    "모든 국민은 주거의 자유를 침해받지 아니한다.",
    "모든 국민은 사생활의 비밀과 자유를 침해받지 아니한다.",
    "모든 국민은 통신의 비밀을 침해받지 아니한다.",
    "모든 국민은 양심의 자유를 가진다.",
    "모든 국민은 종교의 자유를 가진다. 국교는 인정되지 아니하며, 종교와 정치는 분리된다.",
    "모든 국민은 언론·출판의 자유와 집회·결사의 자유를 가진다.",
    "모든 국민은 학문과 예술의 자유를 가진다.",
    "모든 국민의 재산권은 보장된다. 그 내용과 한계는 법률로 정한다.",
    "모든 국민은 법률이 정하는 바에 의하여 선거권을 가진다.",
    "모든 국민은 능력에 따라 균등하게 교육을 받을 권리를 가진다.",
    "모든 국민은 근로의 권리를 가진다.",
    "모든 국민은 인간다운 생활을 할 권리를 가진다.",
    "모든 국민은 건강하고 쾌적한 환경에서 생활할 권리를 가지며, 국가와 국민은 환경보전을 위하여 노력하여야 한다.",
]
JAPANESE = [
    "日本国民は、正当に選挙された国会における代表者を通じて行動し、われらとわれらの子孫のために、"
    "諸国民との協和による成果と、わが国全土にわたつて自由のもたらす恵沢を確保する。",
    "天皇は、日本国の象徴であり日本国民統合の象徴であつて、この地位は、主権の存する日本国民の総意に基く。",
    "すべて国民は、個人として尊重される。",
    "思想及び良心の自由は、これを侵してはならない。",
    "信教の自由は、何人に対してもこれを保障する。",
    "学問の自由は、これを保障する。",
    "すべて国民は、健康で文化的な最低限度の生活を営む権利を有する。",
]
# Beyond the corpus: digits, whitespace runs, a text longer than any model, literal specials.
EXTRA = [
    "모든 권력은 국민으로부터 나온다.",
    "In 2024, 3,141,592 people paid $12.50 (about ₩16,000) on 2024-03-01T12:00:00Z.",
    "  leading   and\t\ttrailing \u00a0 whitespace\u3000runs  ",
    "a <s> b </s> <pad> <unk> <mask> c",
    " ".join(python_docs_paragraphs(40)),
]
# Characters the training text lacks (emoji, a run of them, hanja, rare CJK of plane 2,
# symbols): byte fallback spells them as their UTF-8 bytes, not <unk>. A byte piece's name
# in the text is text: the byte pieces match none.
RARE = [
    "오늘 날씨 최고 🥳🦖 정말!",
    "大韓民國 憲法 第一條: 龘 𠀀 and 國民 of 日本",
    "∮ E⋅da = Q, ⅋ ⌘ ☃ ♜ 🜁 ‱",
    "mixed: café 🦄🦄🦄 end, and a byte piece's name: <0x41>",
]


def corpus_lines():
    """English (Python's help topics), Korean and Japanese, documents of a few lines."""
    english = [" ".join(p.split()) for p in python_docs_paragraphs(600)]
    lines = []
    for i in range(0, len(english), 6):
        lines += english[i:i + 6] + [""]
    for block in (KOREAN, JAPANESE, VARIED[:13]):
        for i in range(0, len(block), 4):
            lines += block[i:i + 4] + [""]
    return lines


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("multiscript")
    (root / "train.txt").write_text("\n".join(corpus_lines()) + "\n", encoding="utf-8")
    (root / "valid.txt").write_text("\n".join(KOREAN[:6] + [""] + EXTRA[1:4] + [""] + RARE)
                                    + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def spm_dir(corpus):
    dest = corpus / "spm"
    assert prepare.main(["--train", str(corpus / "train.txt"), "--valid",
                         str(corpus / "valid.txt"), "--destdir", str(dest),
                         "--sentencepiece-vocab-size", "1500", "--workers", "1"]) == 0
    return dest


@pytest.fixture(scope="module")
def wordpiece_dir(corpus):
    rng = random.Random(3)
    vocab = vocab_for(corpus_lines() + EXTRA, True, rng)
    vocab.append(vocab[12])  # a repeated entry: fairseq's overwrite flag, the last row's id
    (corpus / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    dest = corpus / "wp"
    assert prepare.main(["--train", str(corpus / "train.txt"), "--valid",
                         str(corpus / "valid.txt"), "--destdir", str(dest),
                         "--wordpiece-vocab", str(corpus / "vocab.txt"), "--workers", "1"]) == 0
    return dest


def file_ids(data_dir, kind, texts):
    """ids and offsets from tokenizer.json alone, with the two documented hand-written
    steps (literal specials: text for sentencepiece, <unk> for WordPiece; trimmed offsets)."""
    tok = Tokenizer.from_file(str(data_dir / "tokenizer.json"))
    tok.encode_special_tokens = kind == "sentencepiece"
    specials = fast_tokenizer.special_ids(tok)
    out = []
    for text, enc in zip(texts, tok.encode_batch(texts, add_special_tokens=False)):
        ids = fast_tokenizer.unk_specials(np.array(enc.ids, dtype=np.int64), specials).tolist()
        out.append((ids, fast_tokenizer.trim_offsets(text, enc.tokens, enc.offsets)))
    return out


def offsets_comparable(text):
    """Text whose characters the normaliser keeps one for one (no NFKC expansion or
    composition, no removed format characters): there the offsets must agree exactly."""
    return unicodedata.is_normalized("NFKC", text) and not any(
        unicodedata.category(c) in ("Cf", "Cc") or c == "\ufffd" for c in text)


@pytest.mark.parametrize("kind", ["sentencepiece", "wordpiece"])
def test_tokenizer_json_gives_the_plugins_ids_and_offsets(kind, spm_dir, wordpiece_dir):
    data_dir = spm_dir if kind == "sentencepiece" else wordpiece_dir
    plugin = tokmod.load_tokenizer(str(data_dir))
    assert plugin.kind == kind
    d = Dictionary.load(str(data_dir / "dict.txt"))
    d.add_symbol("<mask>")
    texts = corpus_lines() + KOREAN + JAPANESE + VARIED + EXTRA
    assert max(map(len, texts)) > 4 * 512  # longer than the model
    ties = checked = 0
    for text, (ids, spans) in zip(texts, file_ids(data_dir, kind, texts)):
        pieces = plugin.pieces_with_offsets(text)
        want = [d.index(p) for p, _, _ in pieces]
        if ids != want:
            # Only sentencepiece, only a tie: two segmentations of equal score (up to float32
            # rounding, which sentencepiece's Viterbi sums in) broken differently.
            assert kind == "sentencepiece", (text[:80], ids, want)
            sp = plugin.sp
            score = [sum(sp.get_score(sp.piece_to_id(d[i])) for i in seq) for seq in (ids, want)]
            assert abs(score[0] - score[1]) < 1e-4, (text[:80], score)
            ties += 1
            continue
        if offsets_comparable(text):
            assert spans == [(s, e) for _, s, e in pieces], text[:80]
            checked += 1
    assert ties <= len(texts) // 100
    assert checked > 0.9 * len(texts)


def test_tokenizer_json_ids_are_the_dictionarys(spm_dir, wordpiece_dir):
    for data_dir, names in ((spm_dir, fast_tokenizer.FAIRSEQ_SPECIALS),
                            (wordpiece_dir, fast_tokenizer.BERT_NAMES)):
        tok = Tokenizer.from_file(str(data_dir / "tokenizer.json"))
        d = Dictionary.load(str(data_dir / "dict.txt"))
        d.add_symbol("<mask>")
        vocab = tok.get_vocab()
        assert [vocab[n] for n in names] == [0, 1, 2, 3, len(d) - 1]
        rows = [line.split()[0] for line in (data_dir / "dict.txt").read_text().splitlines()]
        assert all(vocab[row] == d.index(row) for row in rows)  # repeated rows: the last
        pair = tok.encode("모든 국민은", "법 앞에 평등하다.")
        assert pair.ids[0] == 0 and pair.ids.count(2) == 2 and pair.ids[-1] == 2
        assert set(pair.type_ids) == {0}
        # a model trained with --segment-token-types reads type 1 after the first </s>
        typed = tokmod.load_tokenizer(str(data_dir)).fast(pair_type=1).encode("모든", "법")
        first_sep = typed.ids.index(2)
        assert typed.type_ids == [0] * (first_sep + 1) + [1] * (len(typed.ids) - first_sep - 1)


BYTE_PIECES = [f"<0x{b:02X}>" for b in range(256)]


def test_byte_fallback_leaves_no_character_unknown(corpus, spm_dir):
    """electra-prepare's default: what the vocabulary lacks is spelled in byte pieces, by
    the plugin, by tokenizer.json and in the binarized data, and decodes back."""
    from electra_plugin.data.masking import word_starts

    plugin = tokmod.load_tokenizer(str(spm_dir))
    d = Dictionary.load(str(spm_dir / "dict.txt"))
    d.add_symbol("<mask>")
    assert [d.index(p) for p in BYTE_PIECES] == list(range(4, 260))  # spm ids == fairseq ids
    assert plugin.byte_ids().tolist() == list(range(4, 260))
    trained = (corpus / "train.txt").read_text(encoding="utf-8")
    for text in RARE:  # characters never trained on, which NFKC leaves as they are
        assert set(text) - set(trained) - {" "} and offsets_comparable(text), text
    starts = word_starts(d)  # whole-word masking's
    assert not starts[4:260].any()
    for text, (ids, spans) in zip(RARE, file_ids(spm_dir, "sentencepiece", RARE)):
        pieces = plugin.pieces_with_offsets(text)
        assert ids == [d.index(p) for p, _, _ in pieces], text
        assert spans == [(s, e) for _, s, e in pieces], text
        assert 3 not in ids and any(4 <= i < 260 for i in ids), text
        assert plugin.detokenize([p for p, _, _ in pieces]) == text
        # the byte pieces of a character all have its span and spell its UTF-8
        spelled = {}
        for p, s, e in pieces:
            if p in BYTE_PIECES:
                spelled.setdefault((s, e), bytearray()).append(int(p[3:5], 16))
        assert spelled and all(e == s + 1 and text[s].encode("utf-8") == bytes(b)
                               for (s, e), b in spelled.items()), text
        # a masked word that holds byte pieces is one word of the text, begun by a "▁"
        begin = 0
        for i, (p, s, e) in zip(ids, pieces):
            begin = s if starts[i] else begin
            assert p not in BYTE_PIECES or " " not in text[begin:e], (text, p)
    tok = Tokenizer.from_file(str(spm_dir / "tokenizer.json"))
    assert json.loads(tok.to_str())["model"]["byte_fallback"] is True
    for text in RARE:
        assert tok.decode(tok.encode(text).ids) == text
    # the binarized valid split holds the same ids: no <unk>, the text back
    valid = data_utils.load_indexed_dataset(str(spm_dir / "valid"), d)
    rows = [valid[i].tolist()[:-1] for i in range(len(valid))][-len(RARE):]
    assert [plugin.detokenize([d[i] for i in row]) for row in rows] == RARE
    assert all(3 not in row for row in rows)


def test_a_model_without_byte_fallback_works_as_before(corpus, tmp_path):
    """--no-byte-fallback trains the model electra-prepare trained before (no byte pieces,
    rare characters <unk>); such a directory still encodes (the plugin and the tokenizer.json
    an export carries agree), its binarized data loads, and its spm.model is reused as is."""
    dest = tmp_path / "old"
    assert prepare.main(["--train", str(corpus / "train.txt"), "--valid",
                         str(corpus / "valid.txt"), "--out-dir", str(dest),
                         "--sentencepiece-vocab-size", "700", "--no-byte-fallback",
                         "--workers", "1"]) == 0
    plugin = tokmod.load_tokenizer(str(dest))
    assert not plugin.sp.is_byte(4) and plugin.byte_ids().size == 0
    rows = (dest / "dict.txt").read_text(encoding="utf-8").splitlines()
    assert len(rows) == 696 and not any(row.startswith("<0x") for row in rows)
    d = Dictionary.load(str(dest / "dict.txt"))
    d.add_symbol("<mask>")
    tok = Tokenizer.from_file(str(dest / "tokenizer.json"))
    assert json.loads(tok.to_str())["model"]["byte_fallback"] is False
    for text, (ids, _) in zip(RARE, file_ids(dest, "sentencepiece", RARE)):
        assert ids == [d.index(p) for p in plugin.pieces(text)], text
        assert 3 in ids, text  # what the vocabulary lacks is <unk>, as it always was
        assert "\u2047" in plugin.detokenize(plugin.pieces(text))  # sentencepiece's " ⁇ "
    valid = data_utils.load_indexed_dataset(str(dest / "valid"), d)
    assert [d.string(valid[i][:-1]) for i in range(len(valid))][-len(RARE):] == \
        [plugin.encode_line(text) for text in RARE]
    # its spm.model reused as it is: the same dictionary, still without byte pieces
    again = tmp_path / "again"
    assert prepare.main(["--train", str(corpus / "valid.txt"), "--out-dir", str(again),
                         "--spm-model", str(dest / "spm.model"), "--workers", "1"]) == 0
    assert (again / "dict.txt").read_bytes() == (dest / "dict.txt").read_bytes()


def old_binarize(raw_lines, tokenizer, work, name):
    """What electra-prepare wrote before: pieces text from the plugin's Python encoder
    (lines without pieces dropped, one empty line per document break), then
    fairseq-preprocess."""
    out, pending, wrote = [], False, False
    for line in raw_lines:
        pieces = tokenizer.encode_line(line) if line else ""
        if not pieces:
            pending = wrote
            continue
        if pending:
            out.append("")
            pending = False
        out.append(pieces)
        wrote = True
    (work / f"{name}.pieces").write_text("\n".join(out) + "\n", encoding="utf-8")
    fairseq_preprocess(str(work / "bin"), str(work / "dict.txt"),
                       {"trainpref": str(work / f"{name}.pieces")})
    return work / "bin"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sentencepiece", "wordpiece"])
def test_binarizing_is_byte_identical_to_fairseq_preprocess(kind, corpus, spm_dir,
                                                            wordpiece_dir, tmp_path):
    data_dir = spm_dir if kind == "sentencepiece" else wordpiece_dir
    plugin = tokmod.load_tokenizer(str(data_dir))
    (tmp_path / "dict.txt").write_text((data_dir / "dict.txt").read_text(encoding="utf-8"),
                                       encoding="utf-8")
    raw = tmp_path / "raw.txt"
    documents.copy_docs([str(corpus / "train.txt")], str(raw))  # what electra-prepare encodes
    ref = old_binarize(raw.read_text(encoding="utf-8").split("\n")[:-1], plugin, tmp_path,
                       "train")
    for suffix in (".bin", ".idx"):
        assert (data_dir / f"train{suffix}").read_bytes() == \
            (ref / f"train{suffix}").read_bytes(), suffix


# ------------------------------------------------------------ export: transformers end to end
@pytest.fixture(scope="module")
def spm_model(spm_dir, tmp_path_factory):
    """A few pre-training updates on the Korean + English sentencepiece data, exported."""
    from electra_plugin.convert import to_hf

    save = tmp_path_factory.mktemp("spm_model")
    proc = run(train_cmd(spm_dir, save, "--max-update", "4", "--no-epoch-checkpoints",
                         "--disable-validation"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = to_hf(save / "checkpoint_last.pt", save / "hf")
    assert result.hf_tokenizer and result.generator_dir
    return save, Path(result.discriminator_dir)


def hub_of(save, checkpoint, data):
    from electra_plugin.models.electra import ElectraModel

    return ElectraModel.from_pretrained(str(save), checkpoint, str(data))


HF_TEXTS = [KOREAN[1], "모든 권력은 국민으로부터 나온다.", EXTRA[1], VARIED[1], JAPANESE[2]]


@pytest.mark.slow
def test_exported_sentencepiece_model_in_transformers(spm_model, spm_dir):
    from transformers import AutoModel, AutoTokenizer, pipeline

    save, out = spm_model
    hub = hub_of(save, "checkpoint_last.pt", spm_dir)
    tok = AutoTokenizer.from_pretrained(out)
    assert (tok.bos_token, tok.pad_token, tok.eos_token, tok.unk_token, tok.mask_token) == \
        fast_tokenizer.FAIRSEQ_SPECIALS
    assert (tok.cls_token, tok.sep_token) == ("<s>", "</s>")
    assert tok.mask_token_id == len(hub.task.source_dictionary) - 1
    model = AutoModel.from_pretrained(out).eval()
    for text in HF_TEXTS:
        assert tok(text)["input_ids"] == hub.encode(text).tolist(), text
    assert 3 not in tok(KOREAN[1])["input_ids"]  # not all <unk>, as a BERT tokenizer gives
    pair = tok(KOREAN[0], EXTRA[1])
    assert pair["input_ids"] == hub.encode(KOREAN[0], EXTRA[1]).tolist()
    assert set(pair["token_type_ids"]) == {0}  # the model was trained without segment types
    batch = tok(HF_TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = model(**batch).last_hidden_state
    largest = 0.0
    for i, text in enumerate(HF_TEXTS):
        ours = hub.extract_features(hub.encode(text))[0]
        n = len(ours)
        assert bool(batch["attention_mask"][i, :n].all()) and not batch["attention_mask"][i, n:].any()
        largest = max(largest, float((ours - theirs[i, :n]).abs().max()))
    assert largest < 1e-5, largest

    # fill-mask on the generator: the same top predictions and probabilities as the plugin's
    fill = pipeline("fill-mask", model=str(out / "generator"), top_k=5)
    gen = hub.model
    for text in ("대한민국의 주권은 <mask>에게 있고", "The <mask> of the function is returned."):
        got = fill(text)
        ids = torch.tensor([tok(text)["input_ids"]])
        at = int((ids[0] == tok.mask_token_id).nonzero())
        with torch.no_grad():
            hidden, _ = gen.generator(ids)
            probs = gen.generator_head(hidden)[0, at].float().softmax(-1)
        top = probs.topk(5)
        assert [g["token"] for g in got] == top.indices.tolist()
        assert np.allclose([g["score"] for g in got], top.values.tolist(), atol=1e-5)


@pytest.mark.slow
def test_exported_tokenizer_spells_rare_characters_as_the_plugin_does(spm_model, spm_dir):
    """transformers' tokenizer loaded from electra-convert export: the plugin's ids on text
    with emoji, hanja and symbols the training text lacks, byte pieces and no <unk>."""
    from transformers import AutoTokenizer

    save, out = spm_model
    hub = hub_of(save, "checkpoint_last.pt", spm_dir)
    plugin = tokmod.load_tokenizer(str(spm_dir))
    d = hub.task.source_dictionary
    tok = AutoTokenizer.from_pretrained(out)
    for text in RARE:
        ids = tok(text)["input_ids"]
        assert ids == hub.encode(text).tolist(), text
        assert ids == [0] + [d.index(p) for p in plugin.pieces(text)] + [2], text
        assert tok.unk_token_id not in ids and set(tok.convert_ids_to_tokens(ids)) & \
            set(BYTE_PIECES), text
        assert tok.decode(ids, skip_special_tokens=True) == text
    pair = tok(RARE[0], RARE[1])
    assert pair["input_ids"] == hub.encode(RARE[0], RARE[1]).tolist()


@pytest.mark.slow
def test_exported_classifier_in_a_transformers_pipeline(spm_model, spm_dir, tmp_path):
    """Fine-tune on RTE-format pairs with named labels, export, and classify through
    pipeline("text-classification"): the plugin's labels and probabilities."""
    from transformers import pipeline

    from electra_plugin.convert import to_hf

    save, _ = spm_model
    proc = run([sys.executable, "-m", "electra_plugin.cli.extract", save / "checkpoint_last.pt",
                "--out", tmp_path / "disc.pt"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rte = write_rte(tmp_path / "RTE", 16, 8)
    assert preprocess("RTE", rte, spm_dir, tmp_path / "data").returncode == 0
    proc = run_here([sys.executable, "-m", "fairseq_cli.train", tmp_path / "data",
                     "--user-dir", PLUGIN, "--task", "sentence_prediction",
                     "--arch", "electra_tiny", "--cpu",
                     "--num-layers", "2", "--hidden-size", "64", "--num-heads", "4",
                     "--ffn-size", "128", "--embedding-size", "32",
                     "--criterion", "sentence_prediction", "--num-classes", "2",
                     "--init-token", "0", "--finetune-from-model", tmp_path / "disc.pt",
                     "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8",
                     "--max-update", "3", "--save-dir", tmp_path / "ft", "--num-workers", "0",
                     "--data-buffer-size", "0", "--no-epoch-checkpoints", "--seed", "1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = to_hf(tmp_path / "ft" / "checkpoint_last.pt", tmp_path / "hf")
    assert result.architecture == "ElectraForSequenceClassification" and result.hf_tokenizer

    hub = hub_of(tmp_path / "ft", "checkpoint_last.pt", tmp_path / "data")
    labels = hub.task.label_dictionary
    names = [labels[i + labels.nspecial] for i in range(2)]
    assert sorted(names) == ["entailment", "not_entailment"]
    classify = pipeline("text-classification", model=str(tmp_path / "hf"), top_k=None)
    rows = [line.split("\t") for line in (rte / "dev.tsv").read_text().splitlines()[1:]]
    rows += [["0", KOREAN[0], KOREAN[1], "-"]]
    largest = 0.0
    for _, premise, hypothesis, _ in rows:
        got = {g["label"]: g["score"] for g in classify({"text": premise, "text_pair": hypothesis})}
        ours = hub.predict("sentence_classification_head",
                           hub.encode(premise, hypothesis)).exp()[0]
        assert sorted(got) == sorted(names)
        assert np.allclose([got[n] for n in names], ours.tolist(), atol=1e-5), (got, ours)
        largest = max(largest, max(abs(got[n] - p) for n, p in zip(names, ours.tolist())))
    print(f"ElectraForSequenceClassification: largest probability difference {largest:.1e}")


# ------------------------------------------------------------ import: non-WordPiece checkpoints
def hf_checkpoint(path, kind, corpus_text):
    """A transformers ELECTRA discriminator (random weights) with a Unigram or BPE tokenizer
    trained by ``tokenizers``, specials where such tokenizers put them (not fairseq's)."""
    from tokenizers import models, pre_tokenizers, trainers
    from transformers import ElectraConfig, ElectraForPreTraining, PreTrainedTokenizerFast

    if kind == "unigram":  # ALBERT-like: [PAD] [UNK] [CLS] [SEP] [MASK] first
        names = dict(pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                     sep_token="[SEP]", mask_token="[MASK]")
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=600, special_tokens=list(names.values()),
                                          unk_token="[UNK]")
    else:  # RoBERTa-like byte-level BPE: <s> <pad> </s> <unk> <mask>
        names = dict(bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                     mask_token="<mask>", cls_token="<s>", sep_token="</s>")
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=list(dict.fromkeys(
            names.values())), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_text, trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, **names)
    hf_tok.save_pretrained(path)
    config = ElectraConfig(vocab_size=tok.get_vocab_size(), embedding_size=32, hidden_size=64,
                           num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                           max_position_embeddings=128)
    model = ElectraForPreTraining(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every tensor random, so that no row is trivially equal
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05
                    + (1.0 if name.endswith("LayerNorm.weight") else 0.0))
    model.eval().save_pretrained(path)
    return hf_tok, model


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_import_of_non_wordpiece_checkpoints(kind, tmp_path):
    from fairseq import checkpoint_utils
    from safetensors.torch import load_file

    from electra_plugin.models.core.checkpoint import load_checkpoint
    from electra_plugin.convert import from_hf, to_hf

    text = [" ".join(p.split()) for p in python_docs_paragraphs(200)] + KOREAN + JAPANESE
    hf_tok, hf_model = hf_checkpoint(tmp_path / "hf", kind, text)
    result = from_hf(tmp_path / "hf", out_dir=tmp_path / "imported")
    plugin = tokmod.load_tokenizer(str(tmp_path / "imported"))
    assert plugin.kind == "tokenizers"
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [result.checkpoint], arg_overrides={"data": str(tmp_path / "imported")})
    model, d = models[0].eval(), task.source_dictionary
    assert [d.symbols[i] for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"]
    samples = [KOREAN[1], EXTRA[1], text[3][:300], JAPANESE[2], VARIED[1]]
    for sample in samples:
        theirs = [hf_tok.cls_token_id] + hf_tok(sample, add_special_tokens=False)["input_ids"] \
            + [hf_tok.sep_token_id]
        ours = [0] + [d.index(p) for p in plugin.pieces(sample)] + [2]
        # every token keeps its row: the same text reads the same embedding rows
        stored = load_checkpoint(result.checkpoint)["model"][
            "discriminator.embeddings.word_embeddings.weight"]
        assert torch.equal(stored[ours], hf_model.electra.embeddings.word_embeddings.weight[theirs])
        with torch.no_grad():
            want = hf_model.electra(torch.tensor([theirs])).last_hidden_state
            got, _ = model(torch.tensor([ours]), features_only=True)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)

    # export then import: every tensor back bit for bit
    exported = to_hf(result.checkpoint, tmp_path / "exported")
    assert exported.hf_tokenizer
    again = from_hf(tmp_path / "exported", out_dir=tmp_path / "again")
    first = load_checkpoint(result.checkpoint)["model"]
    second = load_checkpoint(again.checkpoint)["model"]
    assert sorted(first) == sorted(second)
    assert all(torch.equal(first[k], second[k]) for k in first)
    # import then export: HF's checkpoint back, every tensor and the tokenizer's ids
    from transformers import AutoTokenizer

    original = load_file(tmp_path / "hf" / "model.safetensors")
    ours = load_file(tmp_path / "exported" / "model.safetensors")
    assert sorted(ours) == sorted(original)
    for key, value in original.items():
        assert torch.equal(ours[key], value), key
    auto = AutoTokenizer.from_pretrained(tmp_path / "exported")
    assert auto.get_vocab() == hf_tok.get_vocab()
    for sample in samples:
        assert auto(sample)["input_ids"] == hf_tok(sample)["input_ids"]
    assert (tmp_path / "exported" / "tokenizer.json").read_bytes() == \
        (tmp_path / "hf" / "tokenizer.json").read_bytes()
    # the pad id in HF's order (the original config may keep ElectraConfig's default, 0)
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["pad_token_id"] == \
        hf_tok.pad_token_id


@pytest.mark.slow
def test_continue_pretraining_an_hf_pair_on_text_in_its_own_tokenizer(tmp_path):
    """HF generator + discriminator (Unigram tokenizer) -> electra-convert import ->
    electra-prepare --tokenizer-from -> fairseq-train --task electra from the import."""
    from transformers import ElectraConfig, ElectraForMaskedLM

    from electra_plugin.convert import from_hf

    text = [" ".join(p.split()) for p in python_docs_paragraphs(200)] + KOREAN + JAPANESE
    hf_tok, disc = hf_checkpoint(tmp_path / "disc", "unigram", text)
    gen = ElectraForMaskedLM(ElectraConfig(
        vocab_size=len(hf_tok), embedding_size=32, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128))
    with torch.no_grad():
        for name, p in gen.named_parameters():
            p.normal_(0, 0.05)
        gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
    gen.eval().save_pretrained(tmp_path / "gen")
    hf_tok.save_pretrained(tmp_path / "gen")
    result = from_hf(tmp_path / "disc", tmp_path / "gen", out_dir=tmp_path / "imported")
    assert result.task == "electra"

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(text[:150] + [""] + text[150:]) + "\n", encoding="utf-8")
    proc = run([sys.executable, "-m", "electra_plugin.cli.prepare", "--train", corpus,
                "--destdir", tmp_path / "data", "--tokenizer-from", tmp_path / "imported",
                "--workers", "1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "data" / "dict.txt").read_bytes() == \
        (tmp_path / "imported" / "dict.txt").read_bytes()
    # the corpus was encoded by the checkpoint's own tokenizer: its ids, not <unk>
    d = Dictionary.load(str(tmp_path / "data" / "dict.txt"))
    first = data_utils.load_indexed_dataset(str(tmp_path / "data" / "train"), d)[0]
    want = [hf_tok.convert_tokens_to_ids(t) for t in hf_tok.tokenize(text[0])]
    plugin = tokmod.load_tokenizer(str(tmp_path / "data"))
    assert first.tolist() == [d.index(p) for p in plugin.pieces(text[0])] + [2]
    assert [d[i] for i in first.tolist()[:-1]] == hf_tok.convert_ids_to_tokens(want)

    proc = train_from_model_cfg(tmp_path / "data", tmp_path / "ck", result.model_cfg, "--restore-file",
                 result.checkpoint, "--reset-optimizer", "--reset-dataloader", "--reset-meters")
    assert_one_update_from(proc, tmp_path / "ck", result.checkpoint)


@pytest.mark.slow
def test_finetune_an_imported_bpe_checkpoint(tmp_path):
    """An HF discriminator with a BPE tokenizer fine-tunes through electra-glue preprocess
    and fairseq-train, and the result exports with that tokenizer."""
    from transformers import AutoTokenizer

    from electra_plugin.convert import from_hf, model_cli_args, to_hf

    text = [" ".join(p.split()) for p in python_docs_paragraphs(200)]
    hf_checkpoint(tmp_path / "hf", "bpe", text)
    result = from_hf(tmp_path / "hf", out_dir=tmp_path / "imported")
    rte = write_rte(tmp_path / "RTE", 16, 8)
    assert preprocess("RTE", rte, tmp_path / "imported", tmp_path / "data").returncode == 0
    proc = run_here([sys.executable, "-m", "fairseq_cli.train", tmp_path / "data", "--user-dir",
                     PLUGIN, "--task", "sentence_prediction", *model_cli_args(result.model_cfg),
                     "--cpu", "--criterion", "sentence_prediction", "--num-classes", "2",
                     "--init-token", "0", "--finetune-from-model", result.checkpoint,
                     "--optimizer", "adam", "--lr", "1e-4", "--batch-size", "8",
                     "--max-update", "1", "--save-dir", tmp_path / "ft", "--num-workers", "0",
                     "--data-buffer-size", "0", "--no-epoch-checkpoints"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    exported = to_hf(tmp_path / "ft" / "checkpoint_last.pt", tmp_path / "out")
    assert exported.architecture == "ElectraForSequenceClassification" and exported.hf_tokenizer
    auto = AutoTokenizer.from_pretrained(tmp_path / "out")
    premise, hypothesis = (rte / "dev.tsv").read_text().splitlines()[1].split("\t")[1:3]
    hub = hub_of(tmp_path / "ft", "checkpoint_last.pt", tmp_path / "data")
    assert auto(premise, hypothesis)["input_ids"] == hub.encode(premise, hypothesis).tolist()


def test_tokenizer_from_errors_are_one_line(spm_dir, corpus, tmp_path):
    from electra_plugin.user_io.errors import ElectraUsageError

    base = ["--train", str(corpus / "valid.txt"), "--destdir", str(tmp_path / "out")]
    for extra, phrase in ((["--tokenizer-from", str(tmp_path)], "has no electra_tokenizer.json"),
                          (["--tokenizer-from", str(spm_dir), "--lowercase"],
                           "--lowercase comes from the tokenizer")):
        with pytest.raises(ElectraUsageError) as e:
            prepare.main(base + extra)
        message = str(e.value)
        assert "\n" not in message and phrase in message, message
    assert not (tmp_path / "out").exists()
    # and a directory prepared from another one has its dictionary and tokenizer
    assert prepare.main(base + ["--tokenizer-from", str(spm_dir), "--workers", "1"]) == 0
    for name in ("dict.txt", "spm.model", "tokenizer.json", "electra_tokenizer.json"):
        assert (tmp_path / "out" / name).read_bytes() == (spm_dir / name).read_bytes(), name
