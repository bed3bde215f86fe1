"""One ``tokenizers`` tokenizer (HF's ``tokenizer.json``) for every vocabulary, in fairseq ids.

The ids are exactly those of the fairseq ``Dictionary`` the data was binarized with:
``<s>``=0 ``<pad>``=1 ``</s>``=2 ``<unk>``=3, then the rows of dict.txt in order, then the
``<mask>`` the plugin's tasks append. So the same file encodes a corpus for fairseq
(:mod:`electra_plugin.data.binarize`) and serves an exported model through
``AutoTokenizer``, with no id mapping in between.

A sentencepiece model keeps its pieces, scores, normalisation (the precompiled charsmap),
Metaspace pre-tokenisation (transformers' own converter builds them) and byte fallback (a
character the model lacks becomes the byte pieces ``<0xNN>`` of its UTF-8, and decodes
back); a WordPiece vocabulary keeps BERT's normaliser and pre-tokeniser. In front of either
goes the plugin's rule that every run of Unicode whitespace is one space.

Two pieces stay hand-written, each for one reason:

* literal special tokens in the text (``[SEP]``, ``<s>``): the plugin sends them as
  ``<unk>`` so raw text never injects a separator; ``tokenizers`` has no alias for an
  added token, so :func:`unk_specials` maps those ids after encoding.
* offsets: the plugin's spans exclude the whitespace a ``▁`` piece stands for;
  ``tokenizers`` includes it, so :func:`trim_offsets` trims it (and splits the one span
  ``tokenizers`` gives the byte pieces of several missing characters in a row).
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import sys
from types import SimpleNamespace
from typing import Collection, List, Sequence, Tuple

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, processors
from tokenizers.models import Unigram

from electra_plugin.data.wordpiece import bert_wordpiece
from electra_plugin.environment.optional import require
from electra_plugin.user_io.errors import ElectraUsageError

__all__ = ["FAIRSEQ_SPECIALS", "BERT_NAMES", "sentencepiece_tokenizer", "wordpiece_tokenizer",
           "placeholders", "renumbered", "set_templates", "special_ids", "unk_specials",
           "trim_offsets"]

# Names of ids 0-3 and of <mask> (the last id).
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
BERT_NAMES = ("[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]")
_UNK = 3
# Score of sentencepiece's control pieces and <mask>: sentencepiece never emits them, and
# this far below every piece the Unigram lattice never picks them over real pieces.
_UNREACHABLE = 1e6
# sentencepiece's byte pieces, which byte fallback spells a missing character's UTF-8 with
_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


@functools.cache
def _whitespace_run() -> str:
    """A run of the characters Python's str.split() splits at (the plugin's whitespace), as a
    regex; found once, when a tokenizer is first built (a scan of every code point, 0.2 s:
    not at import, which every fairseq-train with the plugin pays)."""
    spaces = (chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())
    return "[" + "".join(f"\\x{{{ord(c):x}}}" for c in spaces) + "]+"


def _collapse_whitespace() -> List[normalizers.Normalizer]:
    """The plugin's normalize_whitespace: runs of whitespace -> one space, ends trimmed."""
    return [normalizers.Replace(Regex(_whitespace_run()), " "), normalizers.Strip()]


def set_templates(tokenizer: Tokenizer, names: Sequence[str], pair_type: int) -> None:
    """``<s> A </s>`` and ``<s> A </s> B </s>`` (B's type ``pair_type``), as the hub
    interface and the fine-tuning data build them."""
    bos, _, eos = names[:3]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0 {eos}:0",
        pair=f"{bos}:0 $A:0 {eos}:0 $B:{pair_type} {eos}:{pair_type}",
        special_tokens=[(bos, 0), (eos, 2)])


def sentencepiece_tokenizer(model_path: str, lowercase: bool = False,
                            pair_type: int = 0) -> Tokenizer:
    """A sentencepiece unigram model in fairseq ids.

    dict.txt holds every piece that is neither a control nor the unknown piece, in
    sentencepiece id order (``electra_plugin.data.tokenizer.sentencepiece_dict_lines``).
    """
    require("a tokenizer.json for a sentencepiece vocabulary")  # transformers and protobuf
    from transformers.convert_slow_tokenizer import SpmConverter

    # The converter reads the model proto and builds sentencepiece's normaliser and
    # pre-tokeniser; its original_tokenizer only has to name the file. (Its non-legacy "▁"
    # only at the very start loses it when the text starts with spaces: not used.)
    # handle_byte_fallback: the model below is built here, byte fallback included, so the
    # converter's warning that its own would lack it does not apply
    converter = type("Converter", (SpmConverter,), {"handle_byte_fallback": True})(
        SimpleNamespace(vocab_file=model_path))
    proto = converter.proto
    if proto.trainer_spec.model_type != 1:
        raise ElectraUsageError(f"{model_path} is a sentencepiece "
                                f"{'BPE' if proto.trainer_spec.model_type == 2 else 'non-unigram'} "
                                f"model; only unigram models are supported")
    byte_fallback = proto.trainer_spec.byte_fallback
    kept = [p for p in proto.pieces if p.type not in (2, 3)]  # unk, control
    low = min(p.score for p in kept if p.type != 6) - _UNREACHABLE
    # Byte pieces (<0xE2>, type 6) keep their ids but go as low as the unreachable pieces:
    # sentencepiece matches them against no text, only spells a character it lacks with
    # them, and scored 0 the lattice would read a literal "<0x41>" of the text as one piece.
    # (It still does where that "<0x41>" holds a character the model lacks: tokenizers
    # scores an unknown character below every piece.)
    vocab = ([(name, low) for name in FAIRSEQ_SPECIALS[:4]]
             + [(p.piece, low if p.type == 6 else p.score) for p in kept]
             + [(FAIRSEQ_SPECIALS[4], low)])
    tokenizer = Tokenizer(Unigram(vocab, unk_id=_UNK, byte_fallback=byte_fallback))
    steps = _collapse_whitespace() + ([normalizers.Lowercase()] if lowercase else [])
    # sentencepiece drops the extra whitespace its own normalisation makes (NFKC of "¨" is
    # " ̈"): collapse and trim again after it, then Metaspace puts "▁" for each space.
    steps += [converter.normalizer(proto), normalizers.Replace(Regex(" {2,}"), " "),
              normalizers.Strip()]
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = converter.pre_tokenizer("▁", True)
    tokenizer.decoder = converter.decoder("▁", True)
    if byte_fallback:  # bytes back to characters first, then "▁" to spaces
        tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), tokenizer.decoder])
    # sentencepiece matches user-defined pieces in the raw text, as added tokens do
    tokenizer.add_tokens([AddedToken(p.piece, normalized=False, special=False)
                          for p in proto.pieces if p.type == 4])
    tokenizer.add_special_tokens(list(FAIRSEQ_SPECIALS))
    set_templates(tokenizer, FAIRSEQ_SPECIALS, pair_type)
    return tokenizer


def wordpiece_tokenizer(dict_tokens: Sequence[str], lowercase: bool = True,
                        strip_accents=None, tokenize_chinese_chars: bool = True,
                        pair_type: int = 0) -> Tokenizer:
    """BERT WordPiece over the rows of dict.txt (``dict_tokens``), in fairseq ids.

    The four fairseq specials and ``<mask>`` keep BERT's names (``[CLS]``, ``[PAD]``,
    ``[SEP]``, ``[UNK]``, ``[MASK]``). A token repeated in dict.txt takes its last row, as
    in fairseq and BERT. BERT splits at every whitespace itself: no whitespace rule added.
    """
    names = list(BERT_NAMES[:4]) + list(dict_tokens) + [BERT_NAMES[4]]
    tokenizer = bert_wordpiece(names, lowercase, strip_accents, tokenize_chinese_chars)
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    set_templates(tokenizer, BERT_NAMES, pair_type)
    return tokenizer


def special_ids(tokenizer: Tokenizer) -> np.ndarray:
    """Ids of <s>, <pad>, </s> and <mask> (either naming): what text must never produce."""
    ids = [tokenizer.token_to_id(name) for names in (FAIRSEQ_SPECIALS, BERT_NAMES)
           for i, name in enumerate(names) if i != _UNK]
    return np.array([i for i in ids if i is not None])


def unk_specials(ids: np.ndarray, specials: np.ndarray) -> np.ndarray:
    """``ids`` with every special id (a literal ``[SEP]`` in the text) made ``<unk>``."""
    ids[np.isin(ids, specials)] = _UNK
    return ids


def trim_offsets(text: str, tokens: Sequence[str], offsets) -> List[Tuple[int, int]]:
    """Character spans without the whitespace at their ends; a piece of whitespace only
    (a lone ``▁``) gets an empty span where its own span starts after the whitespace; the
    byte pieces of a run of characters the vocabulary lacks, which a Unigram model fuses
    into one span, get the span of the character each spells, as sentencepiece's."""
    spans = []
    for token, (start, end) in zip(tokens, offsets):
        while start < end and text[start].isspace():
            start += 1
        while start < end and text[end - 1].isspace():
            end -= 1
        spans.append((start, start) if token.strip("\u2581") == "" else (start, end))
    i = 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and _BYTE_PIECE.fullmatch(tokens[j]) and spans[j] == spans[i]:
            j += 1
        start, end = spans[i]
        if j - i > 1 and end - start > 1:
            per_char = [(k, k + 1) for k in range(start, end) for _ in text[k].encode("utf-8")]
            if len(per_char) == j - i:  # else normalisation changed the characters: left whole
                spans[i:j] = per_char
        i = max(j, i + 1)
    return spans


def placeholders(count: int, taken: Collection[str],
                 form: str = "madeupword{:04d}") -> List[str]:
    """``count`` names for embedding rows no token uses, numbered as fairseq names the
    entries that pad a dictionary (madeupword0000, ...), skipping any name in ``taken``."""
    names = (form.format(i) for i in itertools.count())
    return list(itertools.islice((name for name in names if name not in taken), count))


def renumbered(tokenizer: Tokenizer, roles: Sequence[int], pair_type: int = 0,
               padding: Sequence[str] = ()) -> Tuple[Tokenizer, List[int]]:
    """Any ``tokenizers`` tokenizer in fairseq's order: (the tokenizer, old id -> new id).

    ``roles``: the old ids of <s>, <pad>, </s>, <unk> and <mask> (transformers' cls or bos,
    pad, sep or eos, unk and mask tokens); they become 0-3 and the last id, every other id
    keeps its order. The pair template becomes the plugin's ``<s> A </s> B </s>``.
    ``padding``: names for the old ids after the tokenizer's (a released checkpoint's
    embedding rows beyond its tokens); they go just before <mask>, in the model's vocabulary
    where it never produces them: a Unigram piece far below every other, a BPE token no
    merge makes.
    """
    spec = json.loads(tokenizer.to_str())
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    model = spec["model"]
    in_model = len(model["vocab"])
    if len(set(roles)) != 5 or any(r >= in_model for r in roles[:4]) or \
            size - in_model > (roles[4] >= in_model):
        raise ElectraUsageError(
            "the tokenizer's special tokens must be five different tokens of its vocabulary "
            "(<mask> may be an added one) and it may add no other tokens")
    if padding and not (model["type"] == "Unigram" or
                        model["type"] == "BPE" and not model.get("ignore_merges")):
        raise ElectraUsageError(
            f"the {len(padding)} embedding rows beyond the tokenizer's {size} tokens need tokens "
            f"it never produces, which a Unigram or a BPE model (not ignoring merges) holds, not "
            f"this {model['type']} one")
    rows = size + len(padding)
    order = list(roles[:4]) + [i for i in range(rows) if i not in roles] + [roles[4]]
    new_of = [0] * rows
    for new, old in enumerate(order):
        new_of[old] = new
    if isinstance(model["vocab"], list):  # Unigram: the list position is the id
        low = min(score for _, score in model["vocab"]) - _UNREACHABLE
        model["vocab"] = [model["vocab"][old] if old < in_model else [padding[old - size], low]
                          for old in order if old < in_model or old >= size]
        if model.get("unk_id") is not None:
            model["unk_id"] = new_of[model["unk_id"]]
    else:  # BPE, WordPiece, WordLevel: token -> id
        model["vocab"] = {token: new_of[i] for token, i in model["vocab"].items()}
        model["vocab"].update((name, new_of[size + k]) for k, name in enumerate(padding))
    for added in spec.get("added_tokens") or []:
        added["id"] = new_of[added["id"]]
    spec["post_processor"] = None
    out = Tokenizer.from_str(json.dumps(spec))
    placed = set(new_of[size:])
    encoded = out.encode_batch(list(padding), add_special_tokens=False)
    # a Unigram lattice lacking a character of the name takes the piece
    made = [name for name, e in zip(padding, encoded) if placed & set(e.ids)]
    if made:
        raise ElectraUsageError(
            f"the text {made[0]!r} would give the placeholder token of that name, one of "
            f"{len(padding)} for the embedding rows beyond the tokenizer's {size} tokens (its "
            f"vocabulary lacks some of the name's characters)")
    names = [out.id_to_token(i) for i in (0, 1, 2, 3, rows - 1)]
    set_templates(out, names, pair_type)
    return out, new_of
