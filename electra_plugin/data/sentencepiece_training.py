"""Training electra-prepare's sentencepiece vocabulary."""

import os
import re

from ..user_io.errors import ElectraUsageError
from .documents import iter_lines


# sentencepiece's byte fallback adds one piece per byte value, <0x00> ... <0xFF>
BYTE_PIECES = 256


def train_sentencepiece(train_txt, prefix, vocab_size, lowercase, *, seed, workers,
                        character_coverage, input_sentence_size, byte_fallback=True):
    """``prefix``.model: a unigram model whose ids of the specials are fairseq's, with
    sentencepiece's refusals turned into lines naming the option to change.

    ``byte_fallback``: a character the model lacks is spelled as the pieces of its UTF-8
    bytes (ids 4-259, right after <unk>) instead of becoming <unk>, so no text is lost.
    """
    import sentencepiece as spm

    source = train_txt
    if lowercase:
        source = prefix + ".lower.txt"
        with open(source, "w", encoding="utf-8", newline="\n") as out:
            for line in iter_lines(train_txt):
                if line:
                    out.write(line.lower() + "\n")
    if hasattr(spm, "set_random_generator_seed"):
        spm.set_random_generator_seed(seed)
    options = dict(
        input=source,
        model_prefix=prefix,
        model_type="unigram",
        vocab_size=vocab_size,
        character_coverage=character_coverage,
        input_sentence_size=input_sentence_size,
        shuffle_input_sentence=True,
        max_sentence_length=16384,
        num_threads=workers,
        # Same ids as fairseq's Dictionary, so spm ids and dict.txt indices agree.
        bos_id=0, pad_id=1, eos_id=2, unk_id=3,
        bos_piece="<s>", pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
        minloglevel=1,
    )
    if byte_fallback:  # only then: without it the model is byte for byte the one made before
        options["byte_fallback"] = True
    try:
        spm.SentencePieceTrainer.train(**options)
    except (RuntimeError, OSError) as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
        m = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", msg)
        if m:
            raise ElectraUsageError(
                f"--sentencepiece-vocab-size {m.group(1)} is too large for this training text: "
                f"sentencepiece can only make {m.group(2)} pieces from it; use "
                f"--sentencepiece-vocab-size {m.group(2)} or less, or give more text")
        m = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", msg)
        if m and byte_fallback:
            raise ElectraUsageError(
                f"--sentencepiece-vocab-size {m.group(1)} is too small: byte fallback's "
                f"{BYTE_PIECES} byte pieces, the specials and the text's characters need "
                f"{m.group(2)}; use a larger size, a lower --character-coverage or "
                f"--no-byte-fallback")
        if m:
            raise ElectraUsageError(
                f"--sentencepiece-vocab-size {m.group(1)} is too small: the text has {m.group(2)} "
                f"characters to cover; use a larger size or a lower --character-coverage")
        msg = re.sub(r"^.*?\)\s*", "", msg) if msg.startswith("INTERNAL") else msg
        raise ElectraUsageError(f"sentencepiece training failed: {msg}")
    finally:
        if source != train_txt and os.path.exists(source):
            os.unlink(source)
    return prefix + ".model"
