"""BERT WordPiece from the ``tokenizers`` library, and the vocab.txt -> fairseq dict.txt mapping.

:func:`bert_wordpiece` builds the same ``tokenizers`` pipeline that transformers'
``BertTokenizer(vocab_file, do_lower_case=...)`` runs (``BertNormalizer``,
``BertPreTokenizer``, greedy WordPiece, the five BERT specials kept whole when they appear
verbatim in the text), so pieces and ids are BERT's exactly and every piece carries the
character span of the text it came from (SQuAD needs those).
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Union

from tokenizers import Tokenizer
from tokenizers.models import WordPiece
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

from electra_plugin.user_io.errors import ElectraUsageError

__all__ = [
    "BERT_SPECIAL_TOKENS",
    "FAIRSEQ_SPECIAL_SYMBOLS",
    "MASK_SYMBOL",
    "bert_wordpiece",
    "load_vocab",
    "dict_tokens",
    "fairseq_dict_lines",
    "write_fairseq_dict",
    "vocab_to_fairseq_indices",
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

# Unicode White_Space (Rust's char::is_whitespace): what the vocab.txt reader of
# ``tokenizers`` trims from the end of each line.  The vocabulary is read here rather than by
# ``WordPiece.read_file`` because dict.txt needs every row, repeated entries included.
_WHITE_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


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


def bert_wordpiece(
    tokens: Sequence[str],
    lowercase: bool = True,
    strip_accents: Optional[bool] = None,
    tokenize_chinese_chars: bool = True,
) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` giving the pieces of ``BertTokenizer`` over ``tokens``.

    ``strip_accents`` None follows ``lowercase``, as in BERT.
    """
    # Like BertTokenizer: a repeated entry takes the id of its last occurrence.
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = BertNormalizer(clean_text=True,
                                          handle_chinese_chars=tokenize_chinese_chars,
                                          strip_accents=strip_accents, lowercase=lowercase)
    tokenizer.pre_tokenizer = BertPreTokenizer()
    tokenizer.add_special_tokens(list(BERT_SPECIAL_TOKENS))
    return tokenizer


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


def dict_tokens(tokens: Sequence[str], source: str = "vocab.txt") -> List[str]:
    """The symbols of dict.txt's rows for the entries of a vocab.txt, in order."""
    return [tok for tok, _ in _dict_entries(tokens, source)]


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
