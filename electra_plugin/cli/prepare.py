"""Raw text -> fairseq binarized data for ``--task electra``.

Input: plain text, one sentence or paragraph per line, an empty line between documents.
Output (--out-dir): dict.txt, train.bin/.idx, valid.bin/.idx, the tokenizer (spm.model or
vocab.txt) and electra_tokenizer.json, which ``electra_plugin.data.tokenizer.load_tokenizer``
reads to encode further text (fine-tuning data) the same way, and tokenizer.json: the same
tokenizer for the ``tokenizers`` library (and transformers), whose ids are dict.txt's.

The text is encoded in batches by ``tokenizers`` straight into dictionary ids and written
as .bin/.idx (fairseq's mmap format), with a progress bar; the files are the ones
fairseq-preprocess would write from the pieces of the same tokenizer.

Vocabulary, one of:
  --sentencepiece-vocab-size N   train a sentencepiece unigram model on the training split;
                                 ids <s>=0 <pad>=1 </s>=2 <unk>=3 equal fairseq's, so every
                                 piece has the same id in spm.model and dict.txt; with byte
                                 fallback (the default) ids 4-259 are the byte pieces
                                 <0x00>-<0xFF> that spell any character the model lacks
  --spm-model FILE               reuse an existing sentencepiece model
  --wordpiece-vocab vocab.txt    a BERT WordPiece vocabulary (lower-cased unless --no-lowercase)
  --tokenizer-from DIR           the tokenizer of a data directory or an imported checkpoint
                                 (electra-convert import --out DIR): continued pre-training

Examples:
  electra-prepare --train news.txt --out-dir data-bin/news --sentencepiece-vocab-size 8000
  electra-prepare --train a.txt b.txt --valid dev.txt --out-dir out --wordpiece-vocab vocab.txt
"""

import argparse
import glob
import importlib.util
import json
import logging
import os
import shutil
import tempfile

from electra_plugin.cli.command import console
from electra_plugin.cli.vocabulary import command_parser, renamed
from electra_plugin.data import tokenizer as tokmod
from electra_plugin.data.binarize import STAGING_PREFIX, binarize_text
from electra_plugin.data.documents import (MIN_DOCUMENTS_TO_SPLIT, check_input,
                                           choose_valid_units, copy_docs,
                                           document_line_counts, write_splits)
from electra_plugin.data.sentencepiece_training import train_sentencepiece
from electra_plugin.data.staging import install_file, publish
from electra_plugin.user_io.errors import ElectraUsageError
from electra_plugin.user_io.output_dir import refuse_existing
from electra_plugin.user_io.partial_output import removed_on_failure, unusable_destination

SPM_MODEL_FILE = "spm.model"
WORDPIECE_VOCAB_FILE = "vocab.txt"
# Files this script writes into --out-dir; any of them already there needs --force.
TOKENIZER_JSON = "tokenizer.json"
OUTPUT_FILES = ("dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx", SPM_MODEL_FILE,
                WORDPIECE_VOCAB_FILE, tokmod.METADATA_FILE, TOKENIZER_JSON, "preprocess.log")

logger = logging.getLogger(__name__)


def default_workers():
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


# --------------------------------------------------------------------------- main
def build_parser():
    p = command_parser("electra-prepare", __doc__)
    p.add_argument("--train", nargs="+", required=True, metavar="FILE", help="training text file(s)")
    p.add_argument("--valid", nargs="+", metavar="FILE",
                   help="validation text file(s); default: hold out --valid-fraction of the documents")
    p.add_argument("--out-dir", required=True, help="output directory")
    voc = p.add_mutually_exclusive_group(required=True)
    voc.add_argument("--sentencepiece-vocab-size", type=int, metavar="N",
                     help="train a sentencepiece unigram model with N pieces (specials included)")
    voc.add_argument("--spm-model", metavar="FILE", help="use this sentencepiece model")
    voc.add_argument("--wordpiece-vocab", metavar="VOCAB_TXT", help="use this BERT WordPiece vocab.txt")
    voc.add_argument("--tokenizer-from", metavar="DIR",
                     help="use the tokenizer (and so the dictionary) of a data directory, e.g. "
                          "an imported HF checkpoint (electra-convert import --out DIR), so "
                          "that the ids are the ones its weights know")
    p.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=None,
                   help="lower-case text (default: yes for --wordpiece-vocab, no for sentencepiece)")
    p.add_argument("--valid-fraction", type=float, default=0.01,
                   help="fraction of documents held out for validation (default 0.01)")
    p.add_argument("--min-valid-lines", type=int, default=10,
                   help="hold out at least this many lines (default 10)")
    p.add_argument("--seed", type=int, default=1, help="seed of the split and of sentencepiece")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="threads for sentencepiece training and encoding (default: CPUs available)")
    p.add_argument("--input-sentence-size", type=int, default=1_000_000,
                   help="sentencepiece trains on at most this many randomly sampled lines")
    p.add_argument("--character-coverage", type=float, default=1.0,
                   help="share of the characters of the text sentencepiece must cover (default "
                        "1.0, right for English: with 0.9995 even '%%', '@' and '[' lose their "
                        "pieces on 12 MB of news; use 0.9995 for Chinese, Japanese or Korean); "
                        "the rest are spelled as byte pieces, or <unk> with --no-byte-fallback")
    p.add_argument("--byte-fallback", action=argparse.BooleanOptionalAction, default=None,
                   help="with --sentencepiece-vocab-size: spell characters the model lacks "
                        "(emoji, rare hanja, symbols) as their UTF-8 bytes, 256 pieces of the "
                        "vocabulary, instead of <unk> (default: yes)")
    p.add_argument("--force", action="store_true",
                   help="overwrite the output files of an earlier run in --out-dir")
    p.add_argument("--keep-text", action="store_true",
                   help="also write the encoded text (train.pieces.txt, valid.pieces.txt) to --out-dir")
    renamed(p, "--destdir", "--out-dir")
    return p


def parse_args(argv):
    p = build_parser()
    args = p.parse_args(argv)
    if args.sentencepiece_vocab_size is not None and args.sentencepiece_vocab_size < 5:
        p.error("--sentencepiece-vocab-size must be at least 5")
    if not 0 < args.valid_fraction < 1:
        p.error("--valid-fraction must be between 0 and 1")
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if args.min_valid_lines < 1:
        p.error("--min-valid-lines must be at least 1")
    return args


def check_destdir(destdir, force):
    """An interrupted run of this command is redone only when forced; then the one
    output-directory rule, for this command's own files."""
    interrupted = glob.glob(os.path.join(destdir, STAGING_PREFIX + "*"))
    if interrupted and not force:
        raise ElectraUsageError(
            f"--out-dir {destdir!r} holds an interrupted run of this script "
            f"({os.path.basename(interrupted[0])}); run again with --force to redo it")
    refuse_existing(destdir, force, lambda name: name in OUTPUT_FILES or name.endswith(".bin"))
    for leftover in interrupted:
        shutil.rmtree(leftover, ignore_errors=True)


def resolve_lowercase(args):
    if args.lowercase is not None:
        return args.lowercase
    if args.wordpiece_vocab:
        return True
    if args.spm_model:
        # A model made by this script: follow the metadata written next to it.
        meta = os.path.join(os.path.dirname(os.path.abspath(args.spm_model)), tokmod.METADATA_FILE)
        try:
            with open(meta, encoding="utf-8") as f:
                info = json.load(f)
            if info.get("type") == "sentencepiece":
                return bool(info.get("lowercase", False))
        except (OSError, ValueError):
            pass
    return False


def write_pieces_text(destdir):
    """The pieces of the binarized splits as text (train.pieces.txt, valid.pieces.txt)."""
    from fairseq.data import data_utils

    from electra_plugin.data.dictionary import load_dictionary

    d = load_dictionary(destdir)
    for split in ("train", "valid"):
        items = data_utils.load_indexed_dataset(os.path.join(destdir, split), d)
        with open(os.path.join(destdir, f"{split}.pieces.txt"), "w", encoding="utf-8") as out:
            for item in items:
                out.write(d.string(item[:-1]) + "\n")


def verify_output(destdir, dict_lines, stats):
    """Read the result back with fairseq, as the electra task will."""
    from fairseq.data import data_utils

    from electra_plugin.data.dictionary import MASK_SYMBOL, load_dictionary

    logging.getLogger("fairseq.data.data_utils").setLevel(logging.WARNING)
    d = load_dictionary(destdir)
    rows = len(dict_lines) + all(line.split()[0] != MASK_SYMBOL for line in dict_lines)
    if len(d) != d.nspecial + rows:
        raise ElectraUsageError(f"dict.txt gives {len(d)} symbols with <mask>, expected "
                                f"{d.nspecial + rows}")
    for split in ("train", "valid"):
        ds = data_utils.load_indexed_dataset(os.path.join(destdir, split), d)
        want = stats[split]["lines"] + stats[split]["breaks"]
        if ds is None or len(ds) != want:
            raise ElectraUsageError(
                f"{split} split in {destdir} has {0 if ds is None else len(ds)} items, expected {want}")
    return len(d)


def main(argv=None):
    args = parse_args(argv)
    destdir = os.path.abspath(args.out_dir)
    for path in args.train:
        check_input(path, "--train")
    for path in args.valid or ():
        check_input(path, "--valid")
    if args.wordpiece_vocab and not os.path.isfile(args.wordpiece_vocab):
        raise ElectraUsageError(f"--wordpiece-vocab {args.wordpiece_vocab!r} does not exist")
    if args.spm_model and not os.path.isfile(args.spm_model):
        raise ElectraUsageError(f"--spm-model {args.spm_model!r} does not exist")
    if args.byte_fallback is not None and args.sentencepiece_vocab_size is None:
        flag = "--byte-fallback" if args.byte_fallback else "--no-byte-fallback"
        raise ElectraUsageError(f"{flag} applies to a model trained here "
                                f"(--sentencepiece-vocab-size); leave it out, a given vocabulary "
                                f"keeps its own")
    check_destdir(destdir, args.force)
    lowercase = resolve_lowercase(args)

    # Load a given tokenizer early, so a bad vocabulary fails before any real work.
    if args.tokenizer_from:
        if args.lowercase is not None:
            raise ElectraUsageError("--lowercase comes from the tokenizer of --tokenizer-from; "
                                    "leave it out")
        tokmod.load_tokenizer(args.tokenizer_from).dict_lines()
    elif args.wordpiece_vocab:
        tokmod.WordPieceTextTokenizer(args.wordpiece_vocab, lowercase=lowercase).dict_lines()
    elif args.spm_model:
        tokmod.SentencePieceTokenizer(args.spm_model, lowercase=lowercase).dict_lines()

    created = not os.path.isdir(destdir)
    try:
        os.makedirs(destdir, exist_ok=True)
    except OSError as e:
        raise unusable_destination(f"cannot create --out-dir {args.out_dir!r}", e)
    try:  # an existing --out-dir may still be read-only
        work = tempfile.mkdtemp(dir=destdir, prefix=STAGING_PREFIX)
    except OSError as e:
        raise unusable_destination(f"cannot write into --out-dir {args.out_dir!r}", e)
    ok = False
    try:
        with removed_on_failure(destdir):
            result = _prepare(args, destdir, work, lowercase)
        ok = True
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if created and not ok:
            try:
                os.rmdir(destdir)  # only if still empty: the directory this run created
            except OSError:
                pass


def _prepare(args, destdir, work, lowercase):
    # tokenizers' thread pool, made on first use: as many threads as --workers
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.workers))
    raw = {s: os.path.join(work, f"{s}.txt") for s in ("train", "valid")}
    staged = os.path.join(work, "out")
    os.makedirs(staged)

    # 1. split the text (documents kept whole)
    if args.valid:
        t = copy_docs(args.train, raw["train"])
        v = copy_docs(args.valid, raw["valid"])
        logger.info(f"train: {t[0]} documents, {t[1]} lines; valid (given): {v[0]} documents, "
                    f"{v[1]} lines")
    else:
        counts = document_line_counts(args.train)
        by_line = len(counts) < MIN_DOCUMENTS_TO_SPLIT
        if by_line:
            logger.info(f"the training text has {len(counts)} document(s) (empty lines separate them): "
                        f"holding out single lines instead of documents")
            counts = [1] * sum(counts)
            if len(counts) < 2:
                raise ElectraUsageError("the training text has a single line; give more text or pass --valid")
        held = choose_valid_units(counts, args.valid_fraction, args.min_valid_lines, args.seed)
        st = write_splits(args.train, held, by_line, raw["train"], raw["valid"])
        if by_line:
            logger.info(f"train {st['train'][1]} lines; valid (held out, seed {args.seed}) "
                        f"{st['valid'][1]} lines")
        else:
            logger.info(f"train {st['train'][0]} documents, {st['train'][1]} lines; valid (held out, seed "
                        f"{args.seed}) {st['valid'][0]} documents, {st['valid'][1]} lines")

    # 2. the tokenizer, in --out-dir
    if args.sentencepiece_vocab_size is not None:
        byte_fallback = args.byte_fallback is not False
        logger.info(f"training a sentencepiece unigram model, {args.sentencepiece_vocab_size} pieces"
                    f"{', lower-cased' if lowercase else ''}"
                    f"{', byte fallback' if byte_fallback else ', no byte fallback'}")
        source = train_sentencepiece(
            raw["train"], os.path.join(work, "spm"), args.sentencepiece_vocab_size, lowercase,
            seed=args.seed, workers=args.workers, character_coverage=args.character_coverage,
            input_sentence_size=args.input_sentence_size, byte_fallback=byte_fallback)
    elif not args.tokenizer_from:
        source = os.path.abspath(args.spm_model or args.wordpiece_vocab)
    if args.tokenizer_from:  # its files and description, as they are
        tokmod.load_tokenizer(args.tokenizer_from).save_to(staged)
        tokenizer = tokmod.load_tokenizer(staged)
    elif args.wordpiece_vocab:
        install_file(source, os.path.join(staged, WORDPIECE_VOCAB_FILE))
        tokenizer = tokmod.WordPieceTextTokenizer(os.path.join(staged, WORDPIECE_VOCAB_FILE),
                                                  lowercase=lowercase)
    else:
        install_file(source, os.path.join(staged, SPM_MODEL_FILE))
        tokenizer = tokmod.SentencePieceTokenizer(os.path.join(staged, SPM_MODEL_FILE),
                                                  lowercase=lowercase)
    dict_lines = tokenizer.dict_lines()
    with open(os.path.join(staged, "dict.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in dict_lines)
    logger.info(f"{tokenizer.kind} tokenizer: {len(dict_lines)} dict.txt entries "
                f"({len(dict_lines) + 5} symbols with fairseq's 4 specials and <mask>)")

    # 3. encode and binarize
    stats = {}
    for split in ("train", "valid"):
        s = binarize_text(raw[split], os.path.join(staged, split), tokenizer,
                          len(dict_lines) + 4, args.workers, log=logger.info)
        stats[split] = s
        rate = 100.0 * s["unk"] / max(1, s["pieces"])
        spelled = (f", {s['bytes']} byte pieces ({100.0 * s['bytes'] / max(1, s['pieces']):.3f}%)"
                   if tokenizer.byte_ids().size else "")
        logger.info(f"encoded {split}: {s['lines']} lines, {s['pieces']} pieces, {s['unk']} <unk> "
                    f"({rate:.3f}%){spelled}")
        if s["lines"] == 0:
            raise ElectraUsageError(f"the {split} text gives no tokens at all after tokenization")

    # 4. how to encode more text the same way
    tokenizer.save_metadata(staged)
    if tokenizer.kind != "sentencepiece" or importlib.util.find_spec("transformers"):
        tokenizer.fast().save(os.path.join(staged, TOKENIZER_JSON))
    else:  # training needs none of it; the export (which needs transformers) builds it
        logger.info(f"{TOKENIZER_JSON} not written: it is built from the sentencepiece model by "
                    f"transformers' converter (pip install -e '.[hf]'); electra-convert export builds "
                    f"it then")
    if args.keep_text:
        write_pieces_text(staged)

    n_symbols = verify_output(staged, dict_lines, stats)
    sizes = {f: os.path.getsize(os.path.join(staged, f)) for f in ("train.bin", "valid.bin")}
    publish(staged, destdir)
    logger.info(f"done: {destdir} ({n_symbols} symbols with <mask>; "
                f"train.bin {sizes['train.bin'] / 1e6:.1f} MB, "
                f"valid.bin {sizes['valid.bin'] / 1e6:.2f} MB)")
    return 0


cli = console(main)


if __name__ == "__main__":
    cli()
