"""Text -> fairseq pieces, shared by data preparation and later fine-tuning scripts.

A data directory made by ``electra-prepare`` holds, next to ``dict.txt`` and the
binarized splits, the tokenizer it was encoded with and a small metadata file,
``electra_tokenizer.json`` (the plugin's own description; ``tokenizer.json`` beside it is the
same tokenizer in Hugging Face's format)::

    {"format": "electra_plugin.tokenizer", "version": 1,
     "type": "sentencepiece", "model": "spm.model", "lowercase": false}
    {"format": "electra_plugin.tokenizer", "version": 1,
     "type": "wordpiece", "vocab": "vocab.txt", "lowercase": true,
     "strip_accents": null, "tokenize_chinese_chars": true}

``load_tokenizer(data_dir)`` rebuilds the same tokenizer, and ``tok.encode_line(text)`` gives
the space-separated pieces that fairseq's ``Dictionary.encode_line`` (or fairseq-preprocess)
turns into ids.  Pieces never contain whitespace, and anything the tokenizer cannot represent
comes out as fairseq's ``<unk>``; a sentencepiece model trained with byte fallback (what
electra-prepare trains by default) has nothing it cannot represent: a character it lacks
comes out as the byte pieces of its UTF-8 encoding (``<0xF0> <0x9F> <0x98> <0x80>``).
``tok.fast()`` is the same tokenizer as a ``tokenizers`` one whose ids are the dictionary's
(:mod:`electra_plugin.data.fast_tokenizer`): what electra-prepare writes as
``tokenizer.json``. ``pieces`` stays on the original libraries
(sentencepiece, the BERT WordPiece of ``tokenizers``) because they are the reference the
tokenizer.json is tested against, and sentencepiece's float32 Viterbi is what the corpus
was binarized with (``encode_ids``).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tokenizers.decoders import WordPiece as WordPieceDecoder

from electra_plugin.data import fast_tokenizer
from electra_plugin.data.word_cache import WordCache
from electra_plugin.data.wordpiece import (BERT_TO_FAIRSEQ_SPECIAL, bert_wordpiece,
                                           dict_tokens, fairseq_dict_lines, load_vocab)
from electra_plugin.user_io.errors import ElectraUsageError, first_line

__all__ = [
    "METADATA_FILE",
    "UNK_PIECE",
    "FAIRSEQ_RESERVED",
    "TextTokenizer",
    "SentencePieceTokenizer",
    "WordPieceTextTokenizer",
    "TokenizersTextTokenizer",
    "load_tokenizer",
    "normalize_whitespace",
    "sentencepiece_dict_lines",
    "PieceSpan",
]

# (piece, start, end): the piece as ``pieces`` gives it and the characters ``text[start:end]``
# it came from (surrounding whitespace excluded; start == end for a piece of whitespace only).
PieceSpan = Tuple[str, int, int]

METADATA_FILE = "electra_tokenizer.json"
FORMAT_NAME = "electra_plugin.tokenizer"
FORMAT_VERSION = 1
UNK_PIECE = "<unk>"
# Symbols fairseq's Dictionary creates itself, plus the <mask> the plugin's tasks append.
FAIRSEQ_RESERVED = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


def normalize_whitespace(line: str) -> str:
    """Collapse every run of (Unicode) whitespace to one space and trim the ends."""
    return " ".join(line.split())


def _safe_pieces(pieces: List[str]) -> List[str]:
    # fairseq splits a line at any whitespace (re ``\s``); a piece containing some would be
    # cut in two and mis-numbered, so it is sent as <unk> instead.
    return [p if p and not any(c.isspace() for c in p) else UNK_PIECE for p in pieces]


class TextTokenizer:
    """Base class: ``pieces(text)`` and ``encode_line(text)``."""

    kind = "base"

    def __init__(self, lowercase: bool):
        self.lowercase = bool(lowercase)

    def encode_ids(self, lines: Sequence[str], threads: int = 1) -> Tuple[np.ndarray, np.ndarray]:
        """Dictionary ids of ``lines``, no ``<s>``/``</s>``: (every line's ids one after the
        other, int64; the number of ids of each line).

        Exactly the ids of ``pieces`` looked up in dict.txt, computed in batches by the
        tokenizer's own library (corpus-scale binarizing).
        """
        raise NotImplementedError

    def pieces(self, text: str) -> List[str]:
        raise NotImplementedError

    def encode_line(self, text: str) -> str:
        """One line of text -> space-separated pieces for fairseq (may be empty)."""
        return " ".join(self.pieces(text))

    def pieces_with_offsets(self, text: str) -> List[PieceSpan]:
        """``pieces(text)`` with the character span of ``text`` each piece came from.

        Span extraction (SQuAD) needs this to map predicted pieces back to the original text.
        """
        raise NotImplementedError

    def metadata(self) -> Dict[str, Any]:
        raise NotImplementedError

    def byte_ids(self) -> np.ndarray:
        """Dictionary ids of the byte pieces (``<0x00>``...), which spell characters the
        vocabulary lacks; empty without byte fallback. The share of them in encoded text
        is what the share of ``<unk>`` was without it: how well the vocabulary fits."""
        return np.zeros(0, dtype=np.int64)

    def fast(self, pair_type: int = 0):
        """This tokenizer as a ``tokenizers.Tokenizer`` in fairseq dictionary ids, with the
        ``<s> A </s> [B </s>]`` template (B's token type ``pair_type``)."""
        raise NotImplementedError

    def detokenize(self, pieces: List[str]) -> str:
        """Readable text from pieces (the inverse of ``pieces`` up to normalisation)."""
        raise NotImplementedError

    def files(self) -> List[str]:
        """The files the metadata refers to."""
        raise NotImplementedError

    def save_to(self, data_dir: str) -> None:
        """Make ``data_dir`` carry this tokenizer (its files and the metadata), so that
        ``load_tokenizer(data_dir)`` works there, e.g. next to fine-tuning data."""
        for path in self.files():
            target = os.path.join(data_dir, os.path.basename(path))
            if not os.path.exists(target) or not os.path.samefile(path, target):
                shutil.copyfile(path, target)
        self.save_metadata(data_dir)

    def save_metadata(self, data_dir: str) -> str:
        meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION}
        meta.update(self.metadata())
        path = os.path.join(data_dir, METADATA_FILE)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
        return path


class SentencePieceTokenizer(TextTokenizer):
    """A sentencepiece model; unknown pieces come out as ``<unk>``, or as byte pieces when
    the model was trained with byte fallback."""

    kind = "sentencepiece"

    def __init__(self, model_path: str, lowercase: bool = False, model_file: Optional[str] = None):
        super().__init__(lowercase)
        import sentencepiece as spm

        self.model_path = model_path
        self.model_file = model_file or os.path.basename(model_path)
        try:
            self.sp = spm.SentencePieceProcessor(model_file=model_path)
        except (OSError, RuntimeError) as e:
            raise ElectraUsageError(
                f"cannot load sentencepiece model {model_path!r}: {first_line(e)}"
            )
        n = self.sp.get_piece_size()
        # id -> the string fairseq sees for it.
        self._id_to_piece = [
            UNK_PIECE if self.sp.is_unknown(i) else self.sp.id_to_piece(i) for i in range(n)
        ]
        self._to_fairseq = None  # sentencepiece id -> dictionary index, made on first use

    def pieces(self, text: str) -> List[str]:
        text = normalize_whitespace(text)
        if self.lowercase:
            text = text.lower()
        if not text:
            return []
        table = self._id_to_piece
        return _safe_pieces([table[i] for i in self.sp.encode(text)])

    def _fairseq_ids(self) -> np.ndarray:
        """sentencepiece id -> dictionary index (the identity for electra-prepare's models)."""
        if self._to_fairseq is None:
            dict_index = {line.split(" ")[0]: i for i, line in enumerate(self.dict_lines(), 4)}
            self._to_fairseq = np.array([dict_index.get(self.sp.id_to_piece(i), 3)
                                         for i in range(self.sp.get_piece_size())])
        return self._to_fairseq

    def encode_ids(self, lines: Sequence[str], threads: int = 1) -> Tuple[np.ndarray, np.ndarray]:
        # sentencepiece itself, not the tokenizer.json: its float32 Viterbi breaks near-ties
        # between equally good segmentations its own way, and it is several times faster.
        to_fairseq = self._fairseq_ids()
        texts = [normalize_whitespace(line) for line in lines]
        if self.lowercase:
            texts = [text.lower() for text in texts]
        ids, sizes = _flatten(self.sp.encode(texts, num_threads=threads))
        return to_fairseq[ids], sizes

    def byte_ids(self) -> np.ndarray:
        pieces = [i for i in range(self.sp.get_piece_size()) if self.sp.is_byte(i)]
        return self._fairseq_ids()[np.array(pieces, dtype=np.int64)]

    def detokenize(self, pieces: List[str]) -> str:
        return self.sp.decode_pieces(list(pieces))

    def files(self) -> List[str]:
        return [self.model_path]

    def dict_lines(self) -> List[str]:
        return sentencepiece_dict_lines(self.sp, self.model_path)

    def pieces_with_offsets(self, text: str) -> List[PieceSpan]:
        # Encode exactly the string pieces() encodes, remembering where each of its
        # characters was in ``text``: whitespace runs collapse, lower-casing may lengthen;
        # the pieces are checked to be exactly pieces(text).
        chars, where = [], []
        for word in re.finditer(r"\S+", text):
            if chars:
                chars.append(" ")
                where.append(word.start() - 1)
            for i in range(word.start(), word.end()):
                folded = text[i].lower() if self.lowercase else text[i]
                chars.extend(folded)
                where.extend([i] * len(folded))
        norm = "".join(chars)
        if self.lowercase and norm.lower() != norm:  # context-dependent case (final sigma)
            norm = normalize_whitespace(text).lower()
            if len(norm) != len(where):
                raise RuntimeError(f"cannot align lower-cased text {text[:80]!r}")
        if not norm:
            return []
        mapping = self.sp.encode(norm, out_type="offset_mapping")
        pieces = _safe_pieces([self._id_to_piece[i] for i in mapping["ids"]])
        offsets = list(mapping["offsets"])
        # sentencepiece gives the byte pieces of one character empty spans but the last:
        # every one of them gets the character's span (tokenizers' offsets do the same).
        for i in range(len(offsets) - 2, -1, -1):
            begin, end = offsets[i]
            if begin == end and self.sp.is_byte(mapping["ids"][i]) and \
                    self.sp.is_byte(mapping["ids"][i + 1]) and offsets[i + 1][0] == begin:
                offsets[i] = offsets[i + 1]
        spans = []
        for piece, (begin, end) in zip(pieces, offsets):
            while begin < end and norm[begin] == " ":  # "▁x" covers the space before x
                begin += 1
            while begin < end and norm[end - 1] == " ":
                end -= 1
            if begin < end:
                spans.append((piece, where[begin], where[end - 1] + 1))
            else:  # whitespace only: an empty span where the next character starts
                at = where[begin] if begin < len(where) else len(text)
                spans.append((piece, at, at))
        if [p for p, _, _ in spans] != self.pieces(text):
            raise RuntimeError(f"offsets disagree with pieces() for {text[:80]!r}")  # a bug
        return spans

    def metadata(self) -> Dict[str, Any]:
        return {"type": self.kind, "model": self.model_file, "lowercase": self.lowercase}

    def fast(self, pair_type: int = 0):
        self.dict_lines()  # the same checks of the pieces as for dict.txt
        return fast_tokenizer.sentencepiece_tokenizer(self.model_path, self.lowercase,
                                                      pair_type)


class WordPieceTextTokenizer(TextTokenizer):
    """BERT WordPiece (``tokenizers``, see ``electra_plugin.data.wordpiece``); every BERT
    special in the output, ``[UNK]`` or a literal ``[SEP]`` of the text, becomes ``<unk>``,
    so raw text can never inject a real separator or mask."""

    kind = "wordpiece"

    def __init__(
        self,
        vocab_path: str,
        lowercase: bool = True,
        strip_accents: Optional[bool] = None,
        tokenize_chinese_chars: bool = True,
        vocab_file: Optional[str] = None,
    ):
        super().__init__(lowercase)
        self.vocab_path = vocab_path
        self.vocab_file = vocab_file or os.path.basename(vocab_path)
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.vocab_tokens = load_vocab(vocab_path)
        self.wp = bert_wordpiece(self.vocab_tokens, lowercase, strip_accents,
                                 self.tokenize_chinese_chars)
        self._words = None  # the cache of encode_ids, made on first use

    def pieces(self, text: str) -> List[str]:
        return [p for p, _, _ in self.pieces_with_offsets(text)]

    def pieces_with_offsets(self, text: str) -> List[PieceSpan]:
        encoding = self.wp.encode(text, add_special_tokens=False)
        pieces = _safe_pieces([UNK_PIECE if p in BERT_TO_FAIRSEQ_SPECIAL else p
                               for p in encoding.tokens])
        return [(p, s, e) for p, (s, e) in zip(pieces, encoding.offsets)]

    def detokenize(self, pieces: List[str]) -> str:
        return WordPieceDecoder(prefix="##", cleanup=False).decode(list(pieces))

    def files(self) -> List[str]:
        return [self.vocab_path]

    def dict_lines(self) -> List[str]:
        return fairseq_dict_lines(self.vocab_tokens, self.vocab_path)

    def encode_ids(self, lines: Sequence[str], threads: int = 1) -> Tuple[np.ndarray, np.ndarray]:
        # threads: tokenizers sizes its pool once per process, from RAYON_NUM_THREADS
        if self._words is None:
            encoder = self.fast()
            self._words = WordCache(encoder, fast_tokenizer.special_ids(encoder))
        return self._words.encode(lines)

    def fast(self, pair_type: int = 0):
        return fast_tokenizer.wordpiece_tokenizer(
            dict_tokens(self.vocab_tokens, self.vocab_path), self.lowercase,
            self.strip_accents, self.tokenize_chinese_chars, pair_type)

    def metadata(self) -> Dict[str, Any]:
        return {
            "type": self.kind,
            "vocab": self.vocab_file,
            "lowercase": self.lowercase,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
        }


class TokenizersTextTokenizer(TextTokenizer):
    """A ``tokenizer.json`` whose ids are already the dictionary's (a sentencepiece, BPE or
    other tokenizer imported from a Hugging Face checkpoint, see ``electra_plugin.convert``).
    Special tokens in the output (a literal ``</s>`` of the text) become ``<unk>``."""

    kind = "tokenizers"

    def __init__(self, path: str, file: Optional[str] = None):
        super().__init__(lowercase=False)
        from tokenizers import Tokenizer

        self.path = path
        self.file = file or os.path.basename(path)
        try:
            self.tok = Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises a plain Exception for a malformed file
            raise ElectraUsageError(f"cannot read tokenizer {path!r}: {first_line(e)}")
        size = self.tok.get_vocab_size(with_added_tokens=True)
        self.symbols = (list(FAIRSEQ_RESERVED[:4])
                        + [self.tok.id_to_token(i) for i in range(4, size - 1)] + ["<mask>"])
        self._index = {piece: i for i, piece in enumerate(self.symbols)}
        self._specials = np.array([0, 1, 2, size - 1])  # <s> <pad> </s> <mask>

    def _ids(self, encodings) -> Tuple[np.ndarray, np.ndarray]:
        ids, sizes = _flatten(e.ids for e in encodings)
        return fast_tokenizer.unk_specials(ids, self._specials), sizes

    def pieces_with_offsets(self, text: str) -> List[PieceSpan]:
        enc = self.tok.encode(text, add_special_tokens=False)
        ids, _ = self._ids([enc])
        spans = fast_tokenizer.trim_offsets(text, enc.tokens, enc.offsets)
        return [(self.symbols[i], s, e) for i, (s, e) in zip(ids.tolist(), spans)]

    def pieces(self, text: str) -> List[str]:
        return [p for p, _, _ in self.pieces_with_offsets(text)]

    def encode_ids(self, lines: Sequence[str], threads: int = 1) -> Tuple[np.ndarray, np.ndarray]:
        return self._ids(self.tok.encode_batch_fast(list(lines), add_special_tokens=False))

    def fast(self, pair_type: int = 0):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(self.tok.to_str())
        fast_tokenizer.set_templates(tok, [tok.id_to_token(i) for i in (0, 1, 2)], pair_type)
        return tok

    def detokenize(self, pieces: List[str]) -> str:
        return self.tok.decode([self._index.get(p, 3) for p in pieces])

    def files(self) -> List[str]:
        return [self.path]

    def dict_lines(self) -> List[str]:
        for piece in self.symbols[4:-1]:
            if not piece or any(c.isspace() for c in piece) or piece in FAIRSEQ_RESERVED:
                raise ElectraUsageError(f"{self.path}: token {piece!r} cannot be a fairseq "
                                        f"dictionary entry (empty, whitespace or reserved)")
        return [f"{piece} 1" for piece in self.symbols[4:-1]]

    def metadata(self) -> Dict[str, Any]:
        return {"type": self.kind, "file": self.file}


def _flatten(rows) -> Tuple[np.ndarray, np.ndarray]:
    """Lists of ids -> (all ids in one int64 array, the length of each list)."""
    rows = list(rows)
    sizes = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(sizes.sum()))
    return ids, sizes


def sentencepiece_dict_lines(sp, source: str = "sentencepiece model") -> List[str]:
    """dict.txt lines for a sentencepiece model: every piece except control and unknown ones.

    For a model trained by electra-prepare (ids <s>=0 <pad>=1 </s>=2 <unk>=3) the fairseq index
    of every piece equals its sentencepiece id.
    """
    lines = []
    seen = set()
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i):
            continue
        piece = sp.id_to_piece(i)
        if piece in FAIRSEQ_RESERVED:
            raise ElectraUsageError(
                f"{source}: piece {i} is {piece!r}, a symbol fairseq reserves; "
                f"make it a control symbol or train a new model"
            )
        if not piece or any(c.isspace() for c in piece):
            raise ElectraUsageError(f"{source}: piece {i} ({piece!r}) is empty or contains whitespace")
        if piece in seen:
            raise ElectraUsageError(f"{source}: piece {piece!r} occurs twice")
        seen.add(piece)
        lines.append(f"{piece} 1")
    return lines


def tokenizer_from_metadata(data_dir: str, meta: Dict[str, Any]) -> TextTokenizer:
    kind = meta.get("type")
    if kind == "sentencepiece":
        model = meta.get("model", "spm.model")
        return SentencePieceTokenizer(
            os.path.join(data_dir, model), lowercase=bool(meta.get("lowercase", False)), model_file=model
        )
    if kind == "wordpiece":
        vocab = meta.get("vocab", "vocab.txt")
        return WordPieceTextTokenizer(
            os.path.join(data_dir, vocab),
            lowercase=bool(meta.get("lowercase", True)),
            strip_accents=meta.get("strip_accents"),
            tokenize_chinese_chars=bool(meta.get("tokenize_chinese_chars", True)),
            vocab_file=vocab,
        )
    if kind == "tokenizers":
        name = meta.get("file", "tokenizer.json")
        return TokenizersTextTokenizer(os.path.join(data_dir, name), file=name)
    raise ElectraUsageError(f"{os.path.join(data_dir, METADATA_FILE)}: unknown tokenizer type {kind!r}")


def load_tokenizer(data_dir: str) -> TextTokenizer:
    """The tokenizer a data directory made by electra-prepare was encoded with."""
    path = os.path.join(data_dir, METADATA_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise ElectraUsageError(
            f"{data_dir!r} has no {METADATA_FILE}; was it made by electra-prepare?"
        )
    except (OSError, ValueError) as e:
        raise ElectraUsageError(f"cannot read {path!r}: {e}")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ElectraUsageError(f"{path!r} is not an electra_plugin tokenizer description")
    if meta.get("version", 0) > FORMAT_VERSION:
        raise ElectraUsageError(f"{path!r} has version {meta.get('version')}; this code reads up to {FORMAT_VERSION}")
    return tokenizer_from_metadata(data_dir, meta)
