"""Data preparation: the WordPiece tokenizer, vocab.txt -> dict.txt, electra-prepare."""

import json
import logging
import os
import random
import sys
from pathlib import Path

import pytest
from fairseq.data import Dictionary, data_utils

from electra_plugin.cli import prepare
from electra_plugin.data import documents
from electra_plugin.data import tokenizer as tokmod
from electra_plugin.data.wordpiece import load_vocab, vocab_to_fairseq_indices, write_fairseq_dict
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import SPECIALS, VARIED, python_docs_paragraphs, start, vocab_for

REPO = Path(__file__).resolve().parents[1]
PREPARE = ["-m", "electra_plugin.cli.prepare"]  # electra-prepare, installed or not
FETCH = [REPO / "scripts" / "fetch_corpus.py"]


def fairseq_view(pieces):
    return ["<unk>" if p in SPECIALS else p for p in pieces]


def test_wordpiece_matches_transformers_bert_tokenizer(tmp_path):
    transformers = pytest.importorskip(
        "transformers", reason="transformers is needed to compare with BertTokenizer")
    rng = random.Random(0)
    # random mixtures of the lines too, so that words meet punctuation and specials
    texts = VARIED + [" ".join(rng.sample(VARIED[:12], 3)) for _ in range(40)]
    texts += python_docs_paragraphs(300)
    n_tokens = n_unk = n_cont = 0
    for lowercase in (True, False):
        path = tmp_path / f"vocab_{lowercase}.txt"
        vocab = vocab_for(texts, lowercase, rng)
        vocab += [vocab[10], vocab[12] + " \u3000"]  # repeated entries: the last row's id
        path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
        hf = transformers.BertTokenizer(str(path), do_lower_case=lowercase)
        ours = tokmod.WordPieceTextTokenizer(str(path), lowercase=lowercase)
        for text in texts:
            expected = hf(text, add_special_tokens=False, return_offsets_mapping=True)
            pieces = hf.convert_ids_to_tokens(expected["input_ids"])
            spans = ours.pieces_with_offsets(text)
            assert [p for p, _, _ in spans] == fairseq_view(pieces), (lowercase, text)
            assert [(s, e) for _, s, e in spans] == expected["offset_mapping"], (lowercase, text)
            assert ours.wp.encode(text, add_special_tokens=False).ids == expected["input_ids"]
            n_tokens += len(pieces)
            n_unk += pieces.count("[UNK]")
            n_cont += sum(t.startswith("##") for t in pieces)
    # the comparison exercised known, unknown and continuation pieces
    assert n_tokens > 20000 and n_unk > 10 and n_cont > 1000


@pytest.mark.parametrize("lowercase, strip_accents", [(True, None), (False, None), (True, False)])
def test_word_cache_gives_the_ids_of_whole_lines(tmp_path, lowercase, strip_accents):
    """electra-prepare's WordPiece ids come word by word from a cache; they must equal
    tokenizers' encoding of each whole line (literal specials as <unk>), whatever the text:
    specials glued to words, controls, odd spaces, tabs, runs of spaces, over-long words,
    and a cache that fills and starts again."""
    import numpy as np

    from electra_plugin.data.fast_tokenizer import special_ids, unk_specials
    from electra_plugin.data.word_cache import WordCache

    rng = random.Random(1)
    texts = VARIED + python_docs_paragraphs(200)
    lines = texts + [rng.choice(["  ", " ", "\t "]).join(rng.sample(VARIED, 4)) for _ in range(60)]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(vocab_for(texts, lowercase, rng)) + "\n", encoding="utf-8")
    encoder = tokmod.WordPieceTextTokenizer(str(path), lowercase, strip_accents).fast()
    specials = special_ids(encoder)
    cache = WordCache(encoder, specials, max_words=500)
    rng.shuffle(lines)
    n_ids = 0
    for first in range(0, len(lines), 40):
        batch = lines[first:first + 40]
        ids, sizes = cache.encode(batch)
        expected = [unk_specials(np.array(e.ids, dtype=np.int64), specials) for e in
                    encoder.encode_batch(batch, add_special_tokens=False)]
        assert sizes.tolist() == [len(e) for e in expected]
        assert ids.tolist() == np.concatenate(expected).tolist()
        n_ids += len(ids)
    distinct = {word for line in lines for word in line.split(" ")}
    assert n_ids > 10000 and len(cache.row) < len(distinct)  # it filled and started again


def test_wordpiece_rules(tmp_path):
    vocab = SPECIALS + ["hello", "world", ",", "!", "un", "##aff", "##able", "cafe", "北", "京",
                        "x", "##x", "Hello"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    lower = tokmod.WordPieceTextTokenizer(str(tmp_path / "vocab.txt"), lowercase=True)
    assert lower.pieces("Héllo,  WORLD!") == ["hello", ",", "world", "!"]
    assert lower.pieces("unaffable CAFÉ") == ["un", "##aff", "##able", "cafe"]
    assert lower.pieces("unaffablex") == ["un", "##aff", "##able", "##x"]
    assert lower.pieces("unaffabley") == ["<unk>"]  # no '##y': the whole word is unknown
    assert lower.pieces("北京") == ["北", "京"]
    assert lower.pieces("x" * 100) == ["x"] + ["##x"] * 99
    assert lower.pieces("x" * 101) == ["<unk>"]
    # a literal [SEP] stays one piece, and becomes <unk>: text cannot inject a separator
    assert lower.pieces_with_offsets("a [SEP] b") == [("<unk>", 0, 1), ("<unk>", 2, 7),
                                                      ("<unk>", 8, 9)]
    assert lower.encode_line("hello [SEP] zzz") == "hello <unk> <unk>"
    assert lower.detokenize(lower.pieces("unaffable hello")) == "unaffable hello"
    cased = tokmod.WordPieceTextTokenizer(str(tmp_path / "vocab.txt"), lowercase=False)
    assert cased.pieces("Hello hello Héllo") == ["Hello", "hello", "<unk>"]


def test_vocab_to_fairseq_dict(tmp_path):
    vocab = ["[PAD]", "the", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "##s",
             "#fairseq:overwrite", "the", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    write_fairseq_dict(tmp_path / "vocab.txt", tmp_path / "dict.txt")
    lines = (tmp_path / "dict.txt").read_text(encoding="utf-8").splitlines()
    assert lines == ["the 1", "[unused0] 1", "##s 1", "#fairseq:overwrite 1",
                     "the 1 #fairseq:overwrite", ". 1"]

    d = Dictionary.load(str(tmp_path / "dict.txt"))
    mask = d.add_symbol("<mask>")
    assert [d.bos(), d.pad(), d.eos(), d.unk()] == [0, 1, 2, 3]
    assert d.symbols[:4] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert d.symbols[4:] == ["the", "[unused0]", "##s", "#fairseq:overwrite", "the", ".", "<mask>"]
    assert mask == 10 == len(d) - 1
    # a repeated entry resolves to its last row, as in BertTokenizer
    assert d.index("the") == 8 and d.index("#fairseq:overwrite") == 7 and d.index(".") == 9
    assert d.index("[CLS]") == d.unk()  # BERT specials are not dictionary entries
    # each vocab row -> fairseq row of the same symbol (specials -> their fairseq roles)
    assert vocab_to_fairseq_indices(load_vocab(tmp_path / "vocab.txt")) == [
        1, 4, 5, 3, 0, 2, mask, 6, 7, 8, 9]


def test_wordpiece_vocab_errors(tmp_path):
    (tmp_path / "nomask.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    (tmp_path / "fairseq.txt").write_text("\n".join(SPECIALS + ["<s>"]) + "\n", encoding="utf-8")
    cases = [("nomask.txt", "lacks [MASK]"), ("empty.txt", "is empty"),
             ("absent.txt", "cannot read"), ("fairseq.txt", "reserves")]
    for name, phrase in cases:
        with pytest.raises(ElectraUsageError) as err:
            write_fairseq_dict(tmp_path / name, tmp_path / "dict.txt")
        assert phrase in str(err.value) and str(err.value).startswith("electra_plugin: error: ")
    assert not (tmp_path / "dict.txt").exists()


# ------------------------------------------------------------------------- electra-prepare
NAMES = ["Alice", "Bob", "the mayor", "a farmer", "Dr. Chen", "my aunt", "the committee",
         "Zoë", "the old sailor", "our neighbours"]
VERBS = ["visited", "painted", "reported on", "argued about", "sold", "found", "described",
         "repaired", "photographed", "ignored"]
THINGS = ["the bridge", "a red bicycle", "three letters", "the village café", "an empty house",
          "the river bank", "42 apples", "a broken clock", "the museum's garden", "new shoes"]
ENDS = [".", "!", "?", " yesterday.", " in March.", ", or so they said.", " (again).",
        " -- quickly.", " at 5:30 p.m.", "; nobody knew why."]


def write_corpus(path, n_docs, seed, lines_per_doc=(3, 9)):
    """Documents of templated English sentences, an empty line between documents; every
    document is numbered so that all of them differ.  Returns the documents."""
    rng = random.Random(seed)
    docs = []
    for d in range(n_docs):
        lines = [f"Story {d}: {rng.choice(NAMES)} {rng.choice(VERBS)} {rng.choice(THINGS)}."]
        for _ in range(rng.randint(*lines_per_doc)):
            s = f"{rng.choice(NAMES)} {rng.choice(VERBS)} {rng.choice(THINGS)}{rng.choice(ENDS)}"
            lines.append(s[0].upper() + s[1:])
        docs.append(lines)
    path.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n", encoding="utf-8")
    return docs


def run_script(command, *args):
    return start([sys.executable, *command, *args], cwd=REPO)


def finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def documents_of(dataset, dictionary):
    """Split a binarized split back into documents (items of only </s> separate them),
    each a list of lines, each line a list of symbols."""
    docs, cur = [], []
    for i in range(len(dataset)):
        ids = dataset[i].tolist()
        assert ids[-1] == dictionary.eos()
        if len(ids) == 1:
            docs.append(cur)
            cur = []
        else:
            cur.append([dictionary[t] for t in ids[:-1]])
    docs.append(cur)
    return docs


@pytest.mark.slow
def test_prepare_data_sentencepiece_held_out_split(tmp_path):
    docs = write_corpus(tmp_path / "corpus.txt", n_docs=60, seed=1)
    dest = tmp_path / "bin"
    code, _, err = finish(run_script(PREPARE, "--train", tmp_path / "corpus.txt", "--destdir", dest,
                                     "--sentencepiece-vocab-size", 100, "--workers", 2,
                                     "--seed", 5, "--character-coverage", 1.0,
                                     "--no-byte-fallback"))
    assert code == 0, err
    for name in ("dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx", "spm.model",
                 tokmod.METADATA_FILE):
        assert (dest / name).is_file(), name
    assert not [p for p in dest.iterdir() if p.name.startswith(".prepare")]  # scratch removed
    meta = json.loads((dest / tokmod.METADATA_FILE).read_text())
    assert meta["type"] == "sentencepiece" and meta["lowercase"] is False

    d = Dictionary.load(str(dest / "dict.txt"))
    assert len(d) == 100  # 96 pieces after fairseq's 4 specials; spm ids == fairseq ids
    tok = tokmod.load_tokenizer(str(dest))
    assert [d.index(p) for p in tok.pieces("Alice sold new shoes.")] == tok.sp.encode(
        "Alice sold new shoes.")
    expected = [[tok.pieces(line) for line in doc] for doc in docs]

    train = documents_of(data_utils.load_indexed_dataset(str(dest / "train"), d), d)
    valid = documents_of(data_utils.load_indexed_dataset(str(dest / "valid"), d), d)
    # ids decode to exactly the pieces of the input, whole documents in input order
    held = [i for i, doc in enumerate(expected) if doc in valid]
    assert valid == [expected[i] for i in held]
    assert train == [doc for i, doc in enumerate(expected) if i not in held]
    assert 1 <= len(held) < len(docs) and sum(len(docs[i]) for i in held) >= 10
    # --character-coverage 1.0: every character of the training text has a piece
    assert sum(p == "<unk>" for doc in train for line in doc for p in line) == 0


def test_valid_split_choice():
    counts = [3, 1, 7, 2, 5] * 40  # 200 documents
    a = documents.choose_valid_units(counts, 0.01, 10, seed=1)
    assert a == documents.choose_valid_units(counts, 0.01, 10, seed=1)  # deterministic
    assert a != documents.choose_valid_units(counts, 0.01, 10, seed=2)
    assert len(a) >= 2 and sum(counts[i] for i in a) >= 10  # 1% = 2 docs, then >= 10 lines
    big = documents.choose_valid_units(counts, 0.25, 1, seed=1)
    assert len(big) == 50
    assert len(documents.choose_valid_units([4, 4], 0.5, 100, seed=0)) == 1  # never all documents


def test_write_splits_keeps_documents(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a1\n  a2 \n\n\n b1\tx\nb2\nb3\n\nc1\nc2", encoding="utf-8")
    train, valid = tmp_path / "train.txt", tmp_path / "valid.txt"
    assert documents.document_line_counts([src]) == [2, 3, 2]
    stats = documents.write_splits([src], {1}, False, train, valid)  # hold out document 1
    assert train.read_text() == "a1\na2\n\nc1\nc2\n"
    assert valid.read_text() == "b1 x\nb2\nb3\n"
    assert stats == {"train": [2, 4], "valid": [1, 3]}
    documents.write_splits([src], {0, 3, 4}, True, train, valid)  # hold out lines 0, 3 and 4
    assert train.read_text() == "a2\n\nb1 x\n\nc1\nc2\n"
    assert valid.read_text() == "a1\n\nb2\nb3\n"


def test_bytes_that_are_not_utf8_read_as_replacement_and_are_named(tmp_path, caplog):
    """A Latin-1 file's accents become U+FFFD as errors="replace" reads them (an invalid
    sequence one character, the rest kept), and the split says how many lines, and where."""
    src = tmp_path / "in.txt"
    src.write_bytes(b"plain line\ncaf\xe9 au lait\n\n" + "\u00e9t\u00e9 \ufffd is text".encode()
                    + b"\nna\xefve \xe2\x82 end\n")
    train = tmp_path / "train.txt"
    caplog.set_level(logging.WARNING)
    documents.write_splits([src], set(), False, train, None)
    assert train.read_text(encoding="utf-8") == ("plain line\ncaf\ufffd au lait\n\n"
                                                 "\u00e9t\u00e9 \ufffd is text\n"
                                                 "na\ufffdve \ufffd end\n")
    assert [r.getMessage() for r in caplog.records] == [
        f"{src}: 2 line(s) hold bytes that are not UTF-8 (the first: line 2), read as U+FFFD; "
        f"if the file is in another encoding, convert it first (iconv -f latin1 -t utf-8)"]


@pytest.mark.slow
def test_prepare_data_wordpiece_with_valid_file(tmp_path):
    train_docs = write_corpus(tmp_path / "train.txt", n_docs=30, seed=2)
    valid_docs = write_corpus(tmp_path / "valid.txt", n_docs=4, seed=3)
    rng = random.Random(4)
    texts = ["\n".join(doc) for doc in train_docs + valid_docs]
    vocab = [t for t in vocab_for(texts, True, rng) if "q" not in t]  # words with q -> [UNK]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    dest = tmp_path / "bin"
    code, _, err = finish(run_script(PREPARE, "--train", tmp_path / "train.txt", "--valid",
                                     tmp_path / "valid.txt", "--destdir", dest,
                                     "--wordpiece-vocab", tmp_path / "vocab.txt",
                                     "--workers", 1))
    assert code == 0, err
    assert (dest / "vocab.txt").read_text(encoding="utf-8") == "\n".join(vocab) + "\n"
    meta = json.loads((dest / tokmod.METADATA_FILE).read_text())
    assert meta["type"] == "wordpiece" and meta["lowercase"] is True

    d = Dictionary.load(str(dest / "dict.txt"))
    assert len(d) == 4 + len(vocab) - 5
    wp = tokmod.WordPieceTextTokenizer(str(tmp_path / "vocab.txt"), lowercase=True)
    for split, docs in (("train", train_docs), ("valid", valid_docs)):
        got = documents_of(data_utils.load_indexed_dataset(str(dest / split), d), d)
        want = [[wp.pieces(line) for line in doc] for doc in docs]
        assert got == want, split
    n_unk = sum(p == "<unk>" for doc in want for line in doc for p in line)
    assert n_unk > 0  # the words with a 'q' (e.g. "quickly") are unknown


@pytest.mark.slow
def test_usage_errors_are_one_line(tmp_path):
    """One 'electra_plugin: error:' line (prepare.main in process; the fetch script run as a
    command, no traceback), user files untouched."""
    write_corpus(tmp_path / "ok.txt", n_docs=12, seed=6, lines_per_doc=(1, 2))
    ok = tmp_path / "ok.txt"
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "dict.txt").write_text("mine 1\n", encoding="utf-8")
    before = (taken / "dict.txt").stat()
    (tmp_path / "exists.txt").write_text("keep me\n", encoding="utf-8")
    fetch = run_script(FETCH, "news", "--out", tmp_path / "exists.txt", "--cache-dir",
                       tmp_path / "cache")
    cases = {
        "destdir taken": (["--train", ok, "--destdir", taken, "--sentencepiece-vocab-size", 100],
                          "--force"),
        "vocab too large": (["--train", ok, "--destdir", tmp_path / "o3",
                             "--sentencepiece-vocab-size", 5000, "--workers", 1],
                            "--sentencepiece-vocab-size 5000 is too large"),
    }
    for name, (argv, phrase) in cases.items():
        with pytest.raises(ElectraUsageError) as err:
            prepare.main([str(a) for a in argv])
        message = str(err.value)
        assert message.startswith("electra_plugin: error: ") and "\n" not in message, name
        assert phrase in message, (name, message)
    code, out, err = finish(fetch)
    assert code == 1 and "Traceback" not in err, err
    errors = [l for l in err.splitlines() if l.startswith("electra_plugin: error: ")]
    assert len(errors) == 1 and err.rstrip("\n").endswith(errors[0]), err
    assert "--force" in errors[0], errors[0]
    # the user's files are untouched, and nothing was written next to them
    assert (taken / "dict.txt").read_text(encoding="utf-8") == "mine 1\n"
    assert (taken / "dict.txt").stat().st_mtime_ns == before.st_mtime_ns
    assert sorted(p.name for p in taken.iterdir()) == ["dict.txt"]
    assert (tmp_path / "exists.txt").read_text(encoding="utf-8") == "keep me\n"
    assert not (tmp_path / "cache").exists()
    assert not (tmp_path / "o3").exists()  # the directory it made is gone again


def test_usage_errors_in_process(tmp_path):
    """The other bad inputs, through prepare.main (the same exception the command exits with)."""
    write_corpus(tmp_path / "ok.txt", n_docs=12, seed=6, lines_per_doc=(1, 2))
    ok = tmp_path / "ok.txt"
    (tmp_path / "blank.txt").write_text("\n   \n\t\n", encoding="utf-8")
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n", encoding="utf-8")
    (tmp_path / "binonly").mkdir()
    (tmp_path / "binonly" / "test.bin").write_bytes(b"\0" * 8)
    out = str(tmp_path / "out")
    cases = [
        (["--train", tmp_path / "nope.txt", "--destdir", out, "--sentencepiece-vocab-size", 100],
         "does not exist"),
        (["--train", tmp_path / "blank.txt", "--destdir", out, "--sentencepiece-vocab-size", 100],
         "is empty"),
        (["--train", ok, "--valid", tmp_path / "blank.txt", "--destdir", out,
          "--sentencepiece-vocab-size", 100], "is empty"),
        (["--train", ok, "--destdir", out, "--wordpiece-vocab", tmp_path / "vocab.txt"],
         "lacks [MASK]"),
        (["--train", ok, "--destdir", out, "--spm-model", tmp_path / "vocab.txt"],
         "cannot load sentencepiece model"),
        (["--train", ok, "--destdir", tmp_path / "binonly", "--sentencepiece-vocab-size", 100],
         "test.bin"),
        # byte fallback's 256 pieces do not fit: the line names the way out
        (["--train", ok, "--destdir", out, "--sentencepiece-vocab-size", 100, "--workers", 1],
         "byte fallback's 256 byte pieces"),
        (["--train", ok, "--destdir", out, "--spm-model", tmp_path / "vocab.txt",
          "--no-byte-fallback"], "--no-byte-fallback applies to a model trained here"),
    ]
    for argv, phrase in cases:
        with pytest.raises(ElectraUsageError) as err:
            prepare.main([str(a) for a in argv])
        message = str(err.value)
        assert message.startswith("electra_plugin: error: ") and "\n" not in message
        assert phrase in message, (argv, message)
    assert not os.path.exists(out)
    assert sorted(p.name for p in (tmp_path / "binonly").iterdir()) == ["test.bin"]


# The first sentencepiece release whose encode() knows out_type="offset_mapping", which
# SentencePieceTokenizer.pieces_with_offsets (SQuAD) calls: 0.1.99, 0.2.0 and 0.2.1 raise
# "unknown out_type=offset_mapping" (each tried in a throwaway venv).
SENTENCEPIECE_WITH_OFFSETS = "0.2.2"


def setup_argument(name):
    """The value of one keyword argument of setup.py's setup() call."""
    import ast

    tree = ast.parse((REPO / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call)
                and getattr(n.func, "id", None) == "setup")
    return next(ast.literal_eval(k.value) for k in call.keywords if k.arg == name)


def test_console_scripts_name_real_functions():
    """Each command of setup.py exists (this checkout may have none installed), and its
    module run as ``python -m`` calls the same function (the README chain's test runs the
    commands that way)."""
    import ast
    import importlib

    scripts = dict(line.replace(" ", "").split("=")
                   for line in setup_argument("entry_points")["console_scripts"])
    assert {"electra-train", "electra-prepare", "electra-glue", "electra-squad",
            "electra-extract", "electra-convert"} <= set(scripts)
    for name, target in scripts.items():
        module, function = target.split(":")
        loaded = importlib.import_module(module)
        assert callable(getattr(loaded, function)), name
        main_block = next(node for node in ast.parse(Path(loaded.__file__).read_text()).body
                          if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))
        assert ast.unparse(main_block.body[-1]) == f"{function}()", name


def test_setup_requires_a_sentencepiece_with_offset_mapping(tmp_path):
    import sentencepiece
    from packaging.requirements import Requirement
    from packaging.version import Version

    requires = setup_argument("install_requires")
    spec = next(Requirement(r) for r in requires if Requirement(r).name == "sentencepiece")
    floors = [Version(s.version) for s in spec.specifier if s.operator in (">=", "==", "~=")]
    assert floors and min(floors) >= Version(SENTENCEPIECE_WITH_OFFSETS), str(spec)
    # the installed release meets the requirement, and the plugin's offsets work with it
    assert spec.specifier.contains(sentencepiece.__version__)
    text = tmp_path / "text.txt"
    text.write_text("the cat sees a house today .\na dog follows the ball .\n" * 50)
    sentencepiece.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(tmp_path / "spm"), vocab_size=20, num_threads=1,
        minloglevel=2)
    tok = tokmod.SentencePieceTokenizer(str(tmp_path / "spm.model"))
    line = "  a cat  follows the house ."
    assert [line[b:e] for _, b, e in tok.pieces_with_offsets(line) if b < e] == \
        [p.lstrip("\u2581") for p in tok.pieces(line) if p.lstrip("\u2581")]


def test_fairseq_preprocess_runs_in_process_and_leaves_logging_as_it_was(tmp_path, caplog):
    """fairseq-preprocess's main in this process: its summary lines reach ``log`` alone, the
    files are written, no log handler of it stays open, and a missing input is one line."""
    import logging

    from electra_plugin.data.binarize import fairseq_preprocess

    (tmp_path / "train.txt").write_text("a b c\nb c\n")
    (tmp_path / "dict.txt").write_text("a 3\nb 2\nc 1\n")
    fairseq_log = logging.getLogger("fairseq_cli.preprocess")
    before = (list(logging.getLogger().handlers), list(fairseq_log.handlers))
    lines = []
    caplog.set_level(logging.INFO)
    caplog.clear()
    fairseq_preprocess(str(tmp_path / "bin"), str(tmp_path / "dict.txt"),
                       {"trainpref": str(tmp_path / "train.txt")}, log=lines.append)
    assert len(lines) == 2 and all(x.startswith("fairseq-preprocess: [None] ") for x in lines)
    assert lines[0].endswith("Dictionary: 7 types")  # 3 words and fairseq's 4 specials
    assert "train.txt: 2 sents, 7 tokens" in lines[1]  # each line's words and its </s>
    data = data_utils.load_indexed_dataset(str(tmp_path / "bin" / "train"),
                                           Dictionary.load(str(tmp_path / "bin" / "dict.txt")))
    assert [data[i].tolist() for i in range(len(data))] == [[4, 5, 6, 2], [5, 6, 2]]
    assert not [r for r in caplog.records if r.name == "fairseq_cli.preprocess"]
    assert (list(logging.getLogger().handlers), list(fairseq_log.handlers)) == before
    with pytest.raises(ElectraUsageError,
                       match="^electra_plugin: error: fairseq-preprocess failed: .*missing.$"):
        fairseq_preprocess(str(tmp_path / "bin2"), str(tmp_path / "dict.txt"),
                           {"trainpref": str(tmp_path / "missing")})
