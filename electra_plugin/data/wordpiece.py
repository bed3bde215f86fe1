"""A BERT-style WordPiece tokenizer and the vocab.txt -> fairseq dict.txt mapping.

No dependency on ``transformers`` or ``tokenizers``: this is a plain-Python re-implementation
that produces the same tokens as ``transformers.BertTokenizer(vocab_file, do_lower_case=...)``
(which, since transformers 5, is backed by the Rust ``tokenizers`` library).

Pipeline for one piece of text:

1. The five BERT special strings (``[PAD]`` ``[UNK]`` ``[CLS]`` ``[SEP]`` ``[MASK]``) found
   verbatim in the raw text are kept as single tokens, exactly as ``BertTokenizer`` does with
   its added special tokens (case-sensitive, before any normalisation).
2. Every other stretch of text is normalised: NUL, U+FFFD and control/format/private-use
   characters (categories Cc, Cf, Co, Cs; not ``\\t \\n \\r``) are dropped, whitespace becomes a
   space, CJK ideographs get a space on each side; when lower-casing, accents are stripped
   (NFD, then drop category Mn) and then each character is lower-cased on its own.
3. The text is split at whitespace, and every punctuation character (ASCII 33-47, 58-64,
   91-96, 123-126, or any Unicode category P*) becomes a token by itself.
4. Each word is split greedily, longest match first, into vocabulary entries, continuation
   pieces carrying a ``##`` prefix; a word that cannot be split, or that is longer than
   100 characters, becomes ``[UNK]``.

Differences from the original Python BERT code (google-research/bert, and transformers'
``BertTokenizerLegacy``), all following what today's ``BertTokenizer`` does:
unassigned code points (category Cn) are kept rather than dropped, a capital sigma is always
lower-cased to ``σ`` (``str.lower`` of a whole word would give a final ``ς``), text is not
NFC-normalised when not lower-casing, literal special-token strings in the text stay whole,
and U+2B820..U+2B91F are not treated as CJK (see ``_is_cjk``).

Character categories come from Python's ``unicodedata`` (Unicode 14 in Python 3.11), while the
Rust library uses older tables for punctuation, format characters and non-spacing marks and a
newer one for lower-casing.  Checked over every code point: about 120 rare characters (with
lower-casing about 560, mostly marks of Brahmic and historic scripts) that were added or
re-categorised in Unicode 9-16, e.g. U+2E43-U+2E5D punctuation, are split or stripped
differently.  None is Latin, Greek, Cyrillic, CJK, Hangul, Kana or an emoji; ordinary text in
those scripts is tokenized identically.
"""

from __future__ import annotations

import os
import re
import unicodedata
from functools import lru_cache
from typing import Dict, Iterable, List, Optional, Sequence, Union

from electra_plugin.errors import ElectraUsageError

__all__ = [
    "BERT_SPECIAL_TOKENS",
    "FAIRSEQ_SPECIAL_SYMBOLS",
    "MASK_SYMBOL",
    "WordPieceTokenizer",
    "load_vocab",
    "fairseq_dict_lines",
    "write_fairseq_dict",
    "vocab_to_fairseq_indices",
    "text_to_fairseq_pieces",
]

# The BERT special entries a vocab.txt must contain, in the usual BERT order.
BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# fairseq's Dictionary puts these first: <s>=0 <pad>=1 </s>=2 <unk>=3.
FAIRSEQ_SPECIAL_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")
# The plugin's tasks append this one after the entries of dict.txt.
MASK_SYMBOL = "<mask>"
# Which fairseq symbol plays the role of each BERT special.
BERT_TO_FAIRSEQ_SPECIAL = {
    "[CLS]": "<s>",
    "[PAD]": "<pad>",
    "[SEP]": "</s>",
    "[UNK]": "<unk>",
    "[MASK]": MASK_SYMBOL,
}
# fairseq's dictionary loader treats a trailing field of this value as a flag.
_FAIRSEQ_OVERWRITE_FLAG = "#fairseq:overwrite"

_CONTINUATION = "##"
_MAX_WORD_CHARS = 100

# Unicode White_Space characters (what Rust's char::is_whitespace accepts); used to mirror how
# the Rust WordPiece model trims the end of each vocab.txt line.
_WHITE_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)

# Per-character classes used by the basic tokenizer.
_KEEP, _SPACE, _PUNCT, _DROP, _CJK = 0, 1, 2, 3, 4

# ASCII-only fast path: control characters, and a regex that yields words and single
# punctuation characters (ASCII punctuation is exactly 33-47, 58-64, 91-96, 123-126).
_ASCII_DROP = {c: None for c in list(range(0, 9)) + [11, 12] + list(range(14, 32)) + [127]}
_ASCII_DROP.update({9: 32, 10: 32, 13: 32})
_ASCII_WORD_OR_PUNCT = re.compile(r"[^ !-/:-@\[-`{-~]+|[!-/:-@\[-`{-~]")


def _is_cjk(cp: int) -> bool:
    # The "CJK Unified Ideographs" blocks BERT pads with spaces (not Hangul, Kana, ...).
    # Extension E starts at U+2B820, and the original BERT code says so; the Rust code behind
    # today's BertTokenizer starts that range at U+2B920, and we follow it to give the same
    # tokens (U+2B820..U+2B91F, 256 rare ideographs, are not padded).
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B920 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


@lru_cache(maxsize=None)
def _char_class(ch: str) -> int:
    """Class of one character before accent stripping / lower-casing."""
    cp = ord(ch)
    if cp == 0 or cp == 0xFFFD:
        return _DROP
    if ch in "\t\n\r":
        return _SPACE
    cat = unicodedata.category(ch)
    if cat in ("Cc", "Cf", "Co", "Cs"):
        return _DROP
    if ch.isspace():
        return _SPACE
    if _is_cjk(cp):
        return _CJK
    if _is_punctuation(ch):
        return _PUNCT
    return _KEEP


@lru_cache(maxsize=None)
def _fold_char(ch: str, strip_accents: bool, lowercase: bool) -> str:
    """Accent stripping then lower-casing of one (non-space, non-control) character."""
    out = ch
    if strip_accents:
        out = "".join(c for c in unicodedata.normalize("NFD", out) if unicodedata.category(c) != "Mn")
    if lowercase:
        out = "".join(c.lower() for c in out)
    return out


def load_vocab(path: Union[str, os.PathLike]) -> List[str]:
    """Read a WordPiece vocab.txt: one entry per line, line number = id.

    Reads the file the way ``BertTokenizer`` does (lines split at ``\\n``, trailing whitespace
    trimmed, a final newline does not add an entry).  Raises ``ElectraUsageError`` if the file
    cannot be read, is empty, or lacks one of the BERT special entries.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ElectraUsageError(f"cannot read WordPiece vocabulary {path!r}: {e.strerror or e}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ElectraUsageError(
            f"WordPiece vocabulary {path!r} is not UTF-8 text (bad byte at offset {e.start})"
        )
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    tokens = [line.rstrip(_WHITE_SPACE) for line in lines]
    if not any(tokens):
        raise ElectraUsageError(f"WordPiece vocabulary {path!r} is empty")
    present = set(tokens)
    missing = [t for t in BERT_SPECIAL_TOKENS if t not in present]
    if missing:
        raise ElectraUsageError(
            f"WordPiece vocabulary {path!r} lacks {', '.join(missing)} "
            f"(a BERT vocab.txt must contain all of {' '.join(BERT_SPECIAL_TOKENS)})"
        )
    return tokens


class WordPieceTokenizer:
    """BERT tokenizer: basic tokenization followed by greedy WordPiece.

    Args:
        vocab: path of a vocab.txt, or the sequence of its entries (which must include the
            BERT specials).
        do_lower_case: lower-case the text (and strip accents unless ``strip_accents`` is False).
        strip_accents: None follows ``do_lower_case``; True/False forces it on/off.
        tokenize_chinese_chars: put spaces around CJK ideographs.
        keep_special_tokens: keep literal ``[CLS]``/``[SEP]``/... strings of the input whole,
            as ``BertTokenizer`` does; False treats them as ordinary text.
    """

    def __init__(
        self,
        vocab: Union[str, os.PathLike, Sequence[str]],
        do_lower_case: bool = True,
        strip_accents: Optional[bool] = None,
        tokenize_chinese_chars: bool = True,
        keep_special_tokens: bool = True,
        unk_token: str = "[UNK]",
        max_input_chars_per_word: int = _MAX_WORD_CHARS,
    ):
        if isinstance(vocab, (str, os.PathLike)):
            tokens = load_vocab(vocab)
        else:
            tokens = list(vocab)
            missing = [t for t in BERT_SPECIAL_TOKENS if t not in set(tokens)]
            if missing:
                raise ElectraUsageError(f"WordPiece vocabulary lacks {', '.join(missing)}")
        self.vocab_tokens: List[str] = tokens
        # Like BertTokenizer: a repeated entry takes the id of its last occurrence.
        self.vocab: Dict[str, int] = {tok: i for i, tok in enumerate(tokens)}
        self.do_lower_case = bool(do_lower_case)
        self.strip_accents = self.do_lower_case if strip_accents is None else bool(strip_accents)
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.keep_special_tokens = bool(keep_special_tokens)
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word
        specials = sorted(BERT_SPECIAL_TOKENS, key=len, reverse=True)
        self._special_re = re.compile("|".join(re.escape(s) for s in specials))
        self._word_cache: Dict[str, List[str]] = {}

    # ---------------------------------------------------------------- basic tokenization
    def _split_words(self, text: str) -> List[str]:
        """Normalise one stretch of text (no special tokens in it) and split it into words."""
        if text.isascii():
            text = text.translate(_ASCII_DROP)
            if self.do_lower_case:
                text = text.lower()
            return _ASCII_WORD_OR_PUNCT.findall(text)

        words: List[str] = []
        current: List[str] = []
        strip, lower = self.strip_accents, self.do_lower_case
        fold = strip or lower
        cjk_alone = self.tokenize_chinese_chars

        def flush():
            if current:
                words.append("".join(current))
                current.clear()

        for ch in text:
            cls = _char_class(ch)
            if cls == _CJK and not cjk_alone:
                cls = _KEEP
            if cls == _KEEP:
                if fold:
                    # Accent stripping / lower-casing never yield spaces or controls, but a
                    # folded character can be punctuation (e.g. a decomposed compatibility
                    # character), so classify what comes out.
                    for c in _fold_char(ch, strip, lower):
                        if c != ch and _char_class(c) == _PUNCT:
                            flush()
                            words.append(c)
                        else:
                            current.append(c)
                else:
                    current.append(ch)
            elif cls == _SPACE:
                flush()
            elif cls == _PUNCT:
                flush()
                words.append(_fold_char(ch, strip, lower) if fold else ch)
            elif cls == _CJK:
                flush()
                words.append(_fold_char(ch, strip, lower) if fold else ch)
            # _DROP: nothing
        flush()
        return words

    def basic_tokenize(self, text: str) -> List[str]:
        """Words and punctuation before WordPiece (special-token strings kept whole)."""
        if not self.keep_special_tokens:
            return self._split_words(text)
        out: List[str] = []
        pos = 0
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                out.extend(self._split_words(text[pos : m.start()]))
            out.append(m.group())
            pos = m.end()
        if pos < len(text):
            out.extend(self._split_words(text[pos:]))
        return out

    # ---------------------------------------------------------------- wordpiece
    def wordpiece(self, word: str) -> List[str]:
        """Greedy longest-match-first split of one word into vocabulary pieces."""
        cached = self._word_cache.get(word)
        if cached is not None:
            return cached
        pieces = self._wordpiece_uncached(word)
        if len(self._word_cache) < 1_000_000:
            self._word_cache[word] = pieces
        return pieces

    def _wordpiece_uncached(self, word: str) -> List[str]:
        n = len(word)
        if n > self.max_input_chars_per_word:
            return [self.unk_token]
        vocab = self.vocab
        pieces: List[str] = []
        start = 0
        while start < n:
            end = n
            found = None
            while end > start:
                candidate = word[start:end]
                if start > 0:
                    candidate = _CONTINUATION + candidate
                if candidate in vocab:
                    found = candidate
                    break
                end -= 1
            if found is None:
                return [self.unk_token]
            pieces.append(found)
            start = end
        return pieces

    def tokenize(self, text: str) -> List[str]:
        """Text -> list of WordPiece tokens (same as ``BertTokenizer.tokenize``)."""
        specials = set(BERT_SPECIAL_TOKENS) if self.keep_special_tokens else ()
        tokens: List[str] = []
        for word in self.basic_tokenize(text):
            if word in specials:
                tokens.append(word)
            else:
                tokens.extend(self.wordpiece(word))
        return tokens

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> List[int]:
        unk = self.vocab[self.unk_token]
        return [self.vocab.get(t, unk) for t in tokens]

    def fairseq_pieces(self, text: str) -> List[str]:
        """Tokens as fairseq should see them: BERT specials become fairseq's ``<unk>``.

        ``[UNK]`` maps to ``<unk>``; a literal ``[CLS]``/``[SEP]``/``[PAD]``/``[MASK]`` in the
        text also becomes ``<unk>``, so raw text can never inject a real separator or mask.
        """
        return [
            "<unk>" if tok in BERT_TO_FAIRSEQ_SPECIAL else tok for tok in self.tokenize(text)
        ]

    def encode_line(self, text: str) -> str:
        """One line of text -> the space-separated pieces that fairseq-preprocess binarizes."""
        return " ".join(self.fairseq_pieces(text))


def text_to_fairseq_pieces(tokenizer: WordPieceTokenizer, line: str) -> str:
    """Convenience wrapper: ``tokenizer.encode_line(line)``."""
    return tokenizer.encode_line(line)


# -------------------------------------------------------------------- vocab -> dict.txt
def _dict_entries(tokens: Sequence[str], source: str = "vocab.txt"):
    """(token, needs_overwrite_flag) for every non-special vocab entry, in vocab order."""
    missing = [t for t in BERT_SPECIAL_TOKENS if t not in set(tokens)]
    if missing:
        raise ElectraUsageError(f"WordPiece vocabulary {source!r} lacks {', '.join(missing)}")
    reserved = set(FAIRSEQ_SPECIAL_SYMBOLS) | {MASK_SYMBOL}
    seen = set()
    entries = []
    for lineno, tok in enumerate(tokens, start=1):
        if tok in BERT_SPECIAL_TOKENS:
            continue
        if tok in reserved:
            raise ElectraUsageError(
                f"WordPiece vocabulary {source!r} line {lineno} is {tok!r}, which fairseq "
                f"reserves for its own special symbols; rename that entry"
            )
        if "\r" in tok:
            raise ElectraUsageError(
                f"WordPiece vocabulary {source!r} line {lineno} contains a carriage return"
            )
        # A repeated entry: BertTokenizer gives the token the id of its last occurrence.
        # fairseq's Dictionary.load refuses duplicates unless the row carries the overwrite
        # flag, which re-points the token to the new row; earlier rows stay (unreachable),
        # so dict rows keep matching vocab rows one to one.
        entries.append((tok, tok in seen))
        seen.add(tok)
    return entries


def fairseq_dict_lines(tokens: Sequence[str], source: str = "vocab.txt") -> List[str]:
    """dict.txt lines (no newline) for the entries of a vocab.txt, specials left out."""
    lines = []
    for tok, overwrite in _dict_entries(tokens, source):
        lines.append(f"{tok} 1 {_FAIRSEQ_OVERWRITE_FLAG}" if overwrite else f"{tok} 1")
    return lines


def write_fairseq_dict(
    vocab_path: Union[str, os.PathLike], dict_path: Union[str, os.PathLike]
) -> List[str]:
    """Write the fairseq dict.txt for a WordPiece vocab.txt; returns the vocab entries.

    fairseq's ``Dictionary.load`` of the result gives ``<s>``=0 ``<pad>``=1 ``</s>``=2
    ``<unk>``=3, then every vocab entry except the five BERT specials, in vocab order; the
    plugin's tasks then append ``<mask>``.
    """
    tokens = load_vocab(vocab_path)
    lines = fairseq_dict_lines(tokens, os.fspath(vocab_path))
    with open(dict_path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")
    return tokens


def vocab_to_fairseq_indices(tokens: Sequence[str]) -> List[int]:
    """For each vocab.txt row, the fairseq index of the same symbol.

    Rows of the BERT specials map to the fairseq special that plays the same role
    (``[CLS]``->``<s>``, ``[PAD]``->``<pad>``, ``[SEP]``->``</s>``, ``[UNK]``->``<unk>``,
    ``[MASK]``->``<mask>``, the index just after the dict.txt entries).  Useful for moving
    embedding rows of a BERT/ELECTRA checkpoint into fairseq order.
    """
    entries = _dict_entries(tokens)
    n_special = len(FAIRSEQ_SPECIAL_SYMBOLS)
    mask_index = n_special + len(entries)
    special_index = {sym: i for i, sym in enumerate(FAIRSEQ_SPECIAL_SYMBOLS)}
    special_index[MASK_SYMBOL] = mask_index
    out = []
    next_row = n_special
    for tok in tokens:
        if tok in BERT_SPECIAL_TOKENS:
            out.append(special_index[BERT_TO_FAIRSEQ_SPECIAL[tok]])
        else:
            out.append(next_row)
            next_row += 1
    return out
