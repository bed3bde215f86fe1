"""Token tagging: CoNLL files -> pieces with the label on each word's first piece -> a real
fairseq-train run of --task token_tagging -> predictions written back per word, scored by
seqeval's entity F1 (checked by hand), in English and in Korean."""

import json
import sys
import warnings

import pytest

from electra_plugin.cli import prepare
from electra_plugin.cli import tag as tag_cli
from electra_plugin.data import conll
from helpers import PLUGIN, assert_main_error, failure, run_here

ENGLISH = """-DOCSTART- -X- O O

the NN O
cat NN B-ANI
sees VB O
my PR O
neighbour NN B-PER
. . O

a DT O
small JJ O
child NN B-PER
follows VB O
the DT O
red JJ B-ANI
bird NN I-ANI
"""

KOREAN = """철수는 B-PER
서울에서 B-LOC
공부한다 O

영희가 B-PER
부산으로 B-LOC
떠났다 O
"""


def test_scores_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ANI"]]
    predicted = [["B-PER", "I-PER", "O", "O"], ["B-ANI", "B-ANI"]]
    labels = ["O", "B-ANI", "B-LOC", "B-PER", "I-PER"]
    scores = conll.tagging_scores(gold, predicted, labels)
    # entities: gold PER(0-1), LOC(3), ANI(1); predicted PER(0-1), ANI(0), ANI(1):
    # 2 of 3 predicted right, 2 of 3 found
    assert scores["precision"] == pytest.approx(200 / 3)
    assert scores["recall"] == pytest.approx(200 / 3)
    assert scores["f1"] == pytest.approx(200 / 3)
    assert scores["accuracy"] == pytest.approx(100 * 4 / 6)
    # parts of speech are no chunks: accuracy alone
    assert conll.tagging_scores([["NN", "VB"]], [["NN", "NN"]], ["NN", "VB"]) == \
        {"accuracy": 50.0}
    # a model that predicts no entity yet (early validation): zeros, without seqeval's warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert conll.tagging_scores([["B-PER", "O"]], [["O", "O"]], ["O", "B-PER"]) == \
            {"f1": 0.0, "precision": 0.0, "recall": 0.0, "accuracy": 50.0}


def test_reading_and_the_first_piece_rule(tmp_path):
    path = tmp_path / "en.conll"
    path.write_text(ENGLISH)
    sentences = conll.read_conll(str(path))
    assert [s.words for s in sentences][1] == ["a", "small", "child", "follows", "the", "red",
                                               "bird"]
    assert conll.label_list(sentences) == ["O", "B-ANI", "B-PER", "I-ANI"]

    class Pieces:  # a tokenizer that splits every word after its second letter
        def pieces(self, word):
            return [word[:2]] + ([word[2:]] if len(word) > 2 else [])

    class Vocab:
        def bos(self): return 0
        def eos(self): return 2
        def unk(self): return 3
        def index(self, piece): return 10 + len(piece)

    labels = conll.label_list(sentences)
    e = conll.encode(sentences[0], Pieces(), Vocab(), labels, 64, "here")
    # <s> th e | ca t | se es | my | ne ighbour | . </s>
    assert e.first_pieces == [1, 3, 5, 7, 8, 10]
    assert e.targets == [-1, 0, -1, 1, -1, 0, -1, 0, 2, -1, 0, -1]
    assert len(e.tokens) == len(e.targets) == 12
    cut = conll.encode(sentences[0], Pieces(), Vocab(), labels, 8, "here")
    assert cut.first_pieces == [1, 3, 5, 0, 0, 0] and len(cut.tokens) == 8
    bad = conll.Sentence(["x"], ["B-XYZ"])
    with pytest.raises(ValueError, match="label 'B-XYZ' is not among the training labels"):
        conll.encode(bad, Pieces(), Vocab(), labels, 64, "dev.conll, sentence 1")
    (tmp_path / "latin.conll").write_bytes(b"\xef\xbb\xbfthe O\ncaf\xe9 O\n")
    with pytest.raises(ValueError, match="latin.conll:2 is not UTF-8 text"):
        conll.read_conll(str(tmp_path / "latin.conll"))
    (tmp_path / "bom.conll").write_bytes(b"\xef\xbb\xbfthe O\r\ncat B-X\r\n")
    assert conll.read_conll(str(tmp_path / "bom.conll")) == [
        conll.Sentence(["the", "cat"], ["O", "B-X"])]  # Excel's byte-order mark dropped
    (tmp_path / "one.conll").write_text("word\n")
    assert_main_error(tag_cli.main, ["preprocess", "--pretrain-data", str(tmp_path),
                                     "--train", str(tmp_path / "one.conll"), "--destdir",
                                     str(tmp_path / "out")], "dict.txt")


def finetune_and_predict(tmp_path, data, pretrained, *model):
    save = tmp_path / "ck"
    proc = run_here([sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN,
                     "--task", "token_tagging", "--criterion", "token_tagging", *model, "--cpu",
                     "--optimizer", "electra_adam", "--layer-decay", "0.8", "--lr", "1e-3",
                     "--batch-size", "2", "--required-batch-size-multiple", "1",
                     "--max-update", "4",
                     "--save-dir", save,
                     "--num-workers", "0", "--data-buffer-size", "0", "--log-format", "json",
                     "--log-interval", "1", "--disable-validation",
                     *(["--finetune-from-model", pretrained] if pretrained else [])])
    assert proc.returncode == 0, failure("fairseq-train", proc)
    assert '"accuracy"' in proc.stdout
    out = tmp_path / "valid.predictions.conll"
    assert tag_cli.main(["predict", "--checkpoint", str(save / "checkpoint_last.pt"),
                         "--data", str(data), "--split", "valid", "--out", str(out),
                         "--cpu", "--json"]) == 0
    return out


@pytest.mark.slow
def test_english_ner_end_to_end(tmp_path, spm_data, pretrained, capsys):
    (tmp_path / "train.conll").write_text(ENGLISH)
    (tmp_path / "dev.conll").write_text(ENGLISH)
    data = tmp_path / "ner"
    assert tag_cli.main(["preprocess", "--pretrain-data", str(spm_data), "--train",
                         str(tmp_path / "train.conll"), "--valid", str(tmp_path / "dev.conll"),
                         "--destdir", str(data)]) == 0
    assert (data / "labels.txt").read_text().split() == ["O", "B-ANI", "B-PER", "I-ANI"]
    capsys.readouterr()
    out = finetune_and_predict(tmp_path, data, pretrained, "--arch", "electra_tiny")
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    sentences = [s.split("\n") for s in out.read_text().strip().split("\n\n")]
    rows = [line.split() for s in sentences for line in s]
    assert [len(s) for s in sentences] == [6, 7]
    assert [r[0] for r in rows][:6] == ["the", "cat", "sees", "my", "neighbour", "."]
    assert [r[1] for r in rows][:6] == ["O", "B-ANI", "O", "O", "B-PER", "O"]
    gold = [[line.split()[1] for line in s] for s in sentences]
    predicted = [[line.split()[2] for line in s] for s in sentences]
    assert set(sum(predicted, [])) <= {"O", "B-ANI", "B-PER", "I-ANI"}
    assert printed["sentences"] == 2
    assert printed["f1"] == pytest.approx(
        conll.tagging_scores(gold, predicted, ["O", "B-ANI", "B-PER", "I-ANI"])["f1"])

    # served by transformers: ElectraForTokenClassification gives the plugin's logits
    import torch
    import transformers
    from fairseq import checkpoint_utils

    from electra_plugin.cli import convert

    ck = str(tmp_path / "ck" / "checkpoint_last.pt")
    convert.main(["export", ck, "--out", str(tmp_path / "hf")])
    hf = transformers.ElectraForTokenClassification.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.id2label == {0: "O", 1: "B-ANI", 2: "B-PER", 3: "I-ANI"}
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([ck])
    model = models[0].eval()
    from electra_plugin.data.tokenizer import load_tokenizer

    d = task.source_dictionary
    pieces = load_tokenizer(str(data)).pieces("the cat sees my neighbour .")
    tokens = torch.tensor([[d.bos()] + [d.index(p) for p in pieces] + [d.eos()]])
    with torch.no_grad():
        ours, _ = model(tokens, classification_head_name="tagging")
        theirs = hf(input_ids=tokens, token_type_ids=torch.zeros_like(tokens)).logits
    assert (ours - theirs).abs().max() < 1e-5
    print(f"ElectraForTokenClassification: largest logit difference "
          f"{float((ours - theirs).abs().max()):.1e}")
    # transformers' token-classification pipeline finds the entities the plugin predicts
    pipe = transformers.pipeline("token-classification", model=hf,
                                 tokenizer=str(tmp_path / "hf"), aggregation_strategy="first")
    text = "the cat sees my neighbour ."
    found = [(e["entity_group"], e["word"].strip()) for e in pipe(text)]
    tags = [line.split()[2] for line in out.read_text().strip().split("\n\n")[0].split("\n")]
    words = text.split()
    expected = [(tag[2:], word) for tag, word in zip(tags, words) if tag != "O"]
    print("token-classification pipeline:", found, "plugin:", expected)
    assert found == expected

    # and back: the import is the fine-tuned token_tagging checkpoint, bit for bit
    from safetensors.torch import load_file

    from electra_plugin.convert import from_hf

    result = from_hf(tmp_path / "hf", out_dir=tmp_path / "imported")
    imported = tmp_path / "imported" / "checkpoint.pt"
    original = torch.load(ck, map_location="cpu", weights_only=True)["model"]
    back = torch.load(imported, map_location="cpu", weights_only=True)
    assert back["cfg"]["task"]["_name"] == "token_tagging"
    assert sorted(back["model"]) == sorted(original)
    assert all(torch.equal(back["model"][k], original[k]) for k in original)
    assert (tmp_path / "imported" / "labels.txt").read_text().split() == \
        ["O", "B-ANI", "B-PER", "I-ANI"]
    again = tmp_path / "again.conll"
    assert tag_cli.main(["predict", "--checkpoint", str(imported), "--data", str(data),
                         "--split", "valid", "--out", str(again), "--cpu"]) == 0
    assert again.read_text() == out.read_text()
    convert.main(["export", str(imported), "--out", str(tmp_path / "hf2")])
    first, second = (load_file(tmp_path / d / "model.safetensors") for d in ("hf", "hf2"))
    assert sorted(first) == sorted(second)
    assert all(torch.equal(first[k], second[k]) for k in first)
    # and it fine-tunes further with token_tagging, from the options the import gives
    (tmp_path / "further").mkdir()
    finetune_and_predict(tmp_path / "further", data, imported, *result.cli_args)


@pytest.mark.slow
def test_korean_words_split_into_pieces(tmp_path):
    """A Korean vocabulary: Hangul words become several pieces, the label sits on the first."""
    corpus = tmp_path / "ko.txt"
    words = ["철수는", "서울에서", "공부한다", "영희가", "부산으로", "떠났다", "학교에", "간다",
             "친구를", "만났다", "오늘은", "비가", "온다"]
    corpus.write_text("\n".join(" ".join(words[(i + j) % len(words)] for j in range(6))
                                for i in range(400)) + "\n")
    prepare.main(["--train", str(corpus), "--destdir", str(tmp_path / "ko-bin"),
                  "--sentencepiece-vocab-size", "40", "--no-byte-fallback", "--workers", "1"])
    (tmp_path / "ko.conll").write_text(KOREAN)
    data = tmp_path / "ko-ner"
    assert tag_cli.main(["preprocess", "--pretrain-data", str(tmp_path / "ko-bin"), "--train",
                         str(tmp_path / "ko.conll"), "--valid", str(tmp_path / "ko.conll"),
                         "--destdir", str(data)]) == 0
    sentences, first_pieces, labels = conll.load_metadata(str(data), "valid")
    from electra_plugin.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(tmp_path / "ko-bin"))
    counts = [len(tokenizer.pieces(w)) for w in sentences[0].words]
    assert max(counts) > 1  # Hangul words split into several pieces
    starts = [1]
    for n in counts[:-1]:
        starts.append(starts[-1] + n)
    assert first_pieces[0] == starts
    out = finetune_and_predict(tmp_path, data, None, "--arch", "electra_tiny", "--num-layers",
                               "2", "--hidden-size", "64", "--num-heads", "4", "--ffn-size",
                               "128", "--embedding-size", "32")
    rows = [line.split() for line in out.read_text().splitlines() if line]
    assert [r[0] for r in rows] == ["철수는", "서울에서", "공부한다", "영희가", "부산으로", "떠났다"]
    assert [r[1] for r in rows] == ["B-PER", "B-LOC", "O"] * 2
