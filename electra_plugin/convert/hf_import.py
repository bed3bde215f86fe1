"""Import: an HF ELECTRA directory (discriminator, optionally its generator) -> a plugin
checkpoint, dict.txt and tokenizer description (``electra-convert import``)."""

import json
import logging
import os
import shutil
from dataclasses import dataclass
from typing import Collection, Dict, List, Optional, Tuple

import torch
from tokenizers.models import WordPiece

from ..data import fast_tokenizer
from ..data.conll import LABELS_FILE
from ..data.tokenizer import (METADATA_FILE, TokenizersTextTokenizer, WordPieceTextTokenizer)
from ..data.wordpiece import BERT_SPECIAL_TOKENS, load_vocab, vocab_to_fairseq_indices
from ..data.wordpiece import write_fairseq_dict
from ..finetuning.kinds import kind_of_fairseq_task
from ..models.core.checkpoint import task_name, write_checkpoint
from ..models.core.config import SIZE_FIELDS, EncoderSize, cli_options, scaled_size
from ..user_io.errors import ElectraUsageError, first_line
from .families import LEGACY_NAMES, Family
from .hf_files import (HF_BUFFERS, HF_COPY, HF_ORDER, HF_TOKENIZER_FILES,
                       SHARED_ENCODER_FIELDS, check_dictionary, encoder_fields,
                       hf_fast_tokenizer, pair_token_type, prepare_out_dir,
                       read_hf_config, read_hf_weights, read_tokenizer_settings,
                       transformers_module)
from .keys import (CONFIG_TABLE, HeadKind, head_kinds, expand, head_kind, permute_rows, rename,
                   symbols)

logger = logging.getLogger(__name__)


def _generator_fields(fields: dict, generator_size: float,
                      generator_layers: Optional[float]) -> dict:
    """Our generator's per-encoder fields, from the discriminator's and the size fractions."""
    disc = EncoderSize(*(fields[k] for k in SIZE_FIELDS))
    return encoder_fields(fields, scaled_size(disc, generator_size, generator_layers))


def _fit_generator_size(fields: dict, gen_fields: dict, where: str) -> float:
    """generator_size for an HF generator config; errors if our sizing rule cannot give it."""
    head_dim = fields["hidden_size"] // fields["num_heads"]
    gen_hidden, gen_heads, gen_ffn = (gen_fields["hidden_size"], gen_fields["num_heads"],
                                      gen_fields["ffn_size"])
    size = gen_hidden / fields["hidden_size"]
    rule = (f"the plugin's generator keeps the discriminator's {head_dim}-dim heads and scales "
            f"the FFN with the hidden size")
    if gen_hidden % gen_heads or gen_hidden // gen_heads != head_dim or not 0 < size <= 1:
        raise ElectraUsageError(
            f"{where}: a generator with hidden_size {gen_hidden} and {gen_heads} heads does not "
            f"fit the discriminator's hidden_size {fields['hidden_size']} and "
            f"{fields['num_heads']} heads: {rule}")
    expected = _generator_fields(fields, size, None)
    if expected["ffn_size"] != gen_ffn:
        raise ElectraUsageError(
            f"{where}: generator intermediate_size {gen_ffn} should be "
            f"{expected['ffn_size']} for hidden_size {gen_hidden}: {rule}")
    return size


def _fit_generator_layers(fields: dict, gen_fields: dict, where: str) -> Optional[float]:
    """generator_layers for an HF generator's depth: None at the discriminator's."""
    layers, disc_layers = gen_fields["num_layers"], fields["num_layers"]
    if layers == disc_layers:
        return None
    if not 0 < layers < disc_layers:
        raise ElectraUsageError(
            f"{where}: generator num_hidden_layers {layers} is not between 1 and the "
            f"discriminator's {disc_layers}; the plugin's generator is at most as deep as the "
            f"discriminator")
    return layers / disc_layers


# what tells the classes apart when config.json names none (first match wins): the class
# name's suffix and a key prefix only it has
_MARKERS = (("ForMaskedLM", "generator_predictions."), ("ForMaskedLM", "generator_lm_head."),
            ("ForMaskedLM", "lm_predictions."), ("ForMaskedLM", "cls.predictions."),
            ("ForMaskedLM", "decoder."),
            ("ForPreTraining", "discriminator_predictions."),
            ("ForMultipleChoice", "sequence_summary."),
            ("ForQuestionAnswering", "qa_outputs."),
            ("ForSequenceClassification", "classifier.dense."),
            ("ForSequenceClassification", "pooler."),
            ("ForTokenClassification", "classifier."))


def _detect_architecture(family: Family, config: dict, weights: Dict[str, torch.Tensor],
                         where: str) -> str:
    imported = list(family.architectures)
    archs = [a for a in config.get("architectures") or [] if a]
    if archs and archs[0] not in imported:
        raise ElectraUsageError(f"{where}: {archs[0]} is not supported; convert one of "
                                f"{', '.join(imported)}")
    if archs:
        return archs[0]
    for suffix, marker in _MARKERS:
        if any(k.startswith(marker) for k in weights):
            return family.prefix + suffix
    return family.prefix + "Model"


@dataclass
class _HFModel:
    path: str
    config: dict
    weights: Dict[str, torch.Tensor]  # keys with the base prefix ("electra." ...), no buffers
    architecture: str
    family: Family

    @classmethod
    def read(cls, model_dir: str) -> "_HFModel":
        config, family = read_hf_config(model_dir)
        weights = {LEGACY_NAMES(k): v for k, v in read_hf_weights(model_dir).items()}
        architecture = _detect_architecture(family, config, weights, model_dir)
        if architecture == family.prefix + "Model" and \
                not any(k.startswith(family.base) for k in weights):
            weights = {family.base + k: v for k, v in weights.items()}  # base model: no prefix
        weights = {k: v for k, v in weights.items()
                   if k not in HF_BUFFERS and not k.endswith(".position_ids")}
        return cls(model_dir, config, weights, architecture, family)


def _embedding_rows(model: _HFModel) -> int:
    """The rows of the word embedding table, which config.json's vocab_size must give."""
    rows = model.config["vocab_size"]
    table = model.weights.get(model.family.tied_output[1])
    if table is not None and table.size(0) != rows:
        raise ElectraUsageError(f"{model.path}: config.json has vocab_size {rows} but the word "
                                f"embeddings {table.size(0)} rows")
    return rows


def _padding(model_dir: str, rows: int, count: int, taken: Collection[str],
             form: str = "madeupword{:04d}") -> List[str]:
    """Names for the embedding rows beyond the tokenizer's ``count`` tokens: released
    checkpoints pad the table (ModernBERT's 50,368 rows for 50,285 tokens, DeBERTa-v3's
    128,100 for 128,001); keeping every row, pre-training continues on the checkpoint's
    table and export gives it back."""
    if rows < count:
        raise ElectraUsageError(f"{model_dir}: config.json has vocab_size {rows}, fewer than the "
                                f"{count} tokens of its tokenizer; the tokenizer files are not "
                                f"this model's")
    return fast_tokenizer.placeholders(rows - count, taken, form)


def _read_vocab(model_dir: str, rows: int) -> Tuple[List[str], torch.Tensor]:
    """WordPiece entries of an HF directory and, per entry, its fairseq dictionary index.

    Reads vocab.txt, or else the WordPiece model of a tokenizer.json (what transformers 5
    writes instead of vocab.txt). The ``rows`` of the embedding table beyond the entries
    get placeholders in brackets, which BERT's pre-tokenizer splits, so no text gives them.
    """
    path = os.path.join(model_dir, "vocab.txt")
    if os.path.isfile(path):
        tokens = load_vocab(path)
    else:
        tokens = _tokenizer_json_vocab(model_dir)
        path = os.path.join(model_dir, "tokenizer.json")
    tokens += _padding(model_dir, rows, len(tokens), set(tokens), "[madeupword{:04d}]")
    index = vocab_to_fairseq_indices(tokens)
    if sorted(index) != list(range(len(tokens))):
        twice = [t for t in BERT_SPECIAL_TOKENS if tokens.count(t) > 1]
        raise ElectraUsageError(f"{path} lists {', '.join(twice) or 'a special token'} more "
                                f"than once; a fairseq dictionary has one row per special")
    return tokens, torch.tensor(index)


def _tokenizer_json_vocab(model_dir: str) -> List[str]:
    path = os.path.join(model_dir, "tokenizer.json")
    tokenizer = hf_fast_tokenizer(model_dir)
    if tokenizer is None or not isinstance(tokenizer.model, WordPiece):
        raise ElectraUsageError(
            f"{model_dir} has no vocab.txt (nor a WordPiece tokenizer.json); the conversion "
            f"needs the WordPiece vocabulary to order the embedding rows (models with other "
            f"tokenizers are not supported)")
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    tokens = sorted(vocab, key=vocab.get)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise ElectraUsageError(f"{path}: WordPiece ids are not 0..{len(tokens) - 1}")
    missing = [t for t in BERT_SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise ElectraUsageError(f"{path} lacks {', '.join(missing)}")
    return tokens


def _renumbered_tokenizer(model_dir: str, rows: int):
    """(tokenizer.json renumbered to fairseq's order, HF id -> fairseq row) of a checkpoint
    whose tokenizer is not WordPiece (sentencepiece/Unigram, BPE, ...), or None; the
    ``rows`` of the embedding table beyond its tokens get placeholders."""
    tokenizer = hf_fast_tokenizer(model_dir)
    if tokenizer is None or isinstance(tokenizer.model, WordPiece) or \
            os.path.isfile(os.path.join(model_dir, "vocab.txt")):
        return None
    try:
        hf = transformers_module().AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as e:
        raise ElectraUsageError(f"cannot load the tokenizer of {model_dir}: {first_line(e)}")
    roles = [hf.cls_token_id if hf.cls_token_id is not None else hf.bos_token_id,
             hf.pad_token_id,
             hf.sep_token_id if hf.sep_token_id is not None else hf.eos_token_id,
             hf.unk_token_id, hf.mask_token_id]
    if any(r is None for r in roles):
        raise ElectraUsageError(f"{model_dir}: the tokenizer needs cls (or bos), pad, sep (or "
                                f"eos), unk and mask tokens to map onto fairseq's <s> <pad> "
                                f"</s> <unk> <mask>")
    padding = _padding(model_dir, rows, tokenizer.get_vocab_size(with_added_tokens=True),
                       tokenizer.get_vocab(with_added_tokens=True))
    try:
        renumbered, new_of = fast_tokenizer.renumbered(tokenizer, roles, padding=padding)
    except ElectraUsageError as e:
        raise ElectraUsageError(f"{model_dir}: {e}") from None
    return renumbered, torch.tensor(new_of)


@dataclass
class ImportResult:
    checkpoint: str
    dictionary: str
    model_cfg: dict
    task: str

    @property
    def cli_args(self) -> List[str]:
        return model_cli_args(self.model_cfg)


def model_cli_args(model_cfg) -> List[str]:
    """fairseq-train options that build the model of ``model_cfg`` (to continue training)."""
    from ..models.bodies import discriminator_options

    return ["--arch", "electra"] + cli_options(model_cfg, (
        *discriminator_options(model_cfg), "generator_size", "generator_layers", "dropout",
        "attention_dropout", "embedding_sharing", "segment_token_types"))


def _default_generator_size(num_heads: int) -> float:
    """A valid placeholder for discriminator-only checkpoints: about 1/4, whole heads."""
    return max(1, round(num_heads / 4)) / num_heads


def from_hf(discriminator_dir, generator_dir=None, *, out_dir,
            head_name: Optional[str] = None, overwrite: bool = False) -> ImportResult:
    """Hugging Face ELECTRA directory(ies) -> ``out_dir/{checkpoint.pt,dict.txt,vocab.txt}``.

    Args:
        discriminator_dir: ``ElectraForPreTraining``, ``ElectraModel`` or a fine-tuned
            head class (config.json, weights, vocab.txt): ``ElectraForSequenceClassification``
            and ``ElectraForMultipleChoice`` load into sentence_prediction and sentence_ranking
            runs, ``ElectraForTokenClassification`` is a token_tagging checkpoint (labels.txt
            from its id2label), ``ElectraForQuestionAnswering`` a SQuAD 1.1 one.
        generator_dir: optional ``ElectraForMaskedLM``; with it the checkpoint is a
            pre-training one (task ``electra``: generator, discriminator, replaced-token
            head) and the discriminator must be an ``ElectraForPreTraining``.
        out_dir: an empty (or new) directory; it also becomes the checkpoint's data
            directory (``dict.txt`` and ``electra_tokenizer.json`` to encode text with).
        head_name: fairseq name of an imported head (default: its task's).
        overwrite: replace the files a previous import wrote there.

    Without a generator the checkpoint is discriminator-only (task ``masked_lm``, which
    loads the same dictionary): for fine-tuning with ``--restore-file``/``--finetune-from-model``
    or ``load_model_ensemble_and_task``.
    """
    discriminator_dir, out_dir = os.fspath(discriminator_dir), os.fspath(out_dir)
    disc = _HFModel.read(discriminator_dir)
    family = disc.family
    if disc.architecture == family.prefix + "ForMaskedLM":
        raise ElectraUsageError(
            f"{discriminator_dir} is a generator ({disc.architecture}); give the discriminator "
            f"({family.prefix}ForPreTraining or {family.prefix}Model) first and the generator "
            f"as the generator")
    vocab_size = _embedding_rows(disc)
    other = _renumbered_tokenizer(discriminator_dir, vocab_size)  # None: WordPiece
    if other is None:
        tokens, index = _read_vocab(discriminator_dir, vocab_size)
    else:
        index = other[1]
        tokens = [other[0].id_to_token(i) for i in range(len(index))]
    fields = family.fields_from_hf(disc.config)
    components = family.architectures[disc.architecture]
    kind = head_kind(architecture=disc.architecture) if len(components) > 1 and \
        components[1] in {k.component for k in head_kinds()} else None
    head_name = head_name or (kind.head_name if kind else head_kinds()[0].head_name)
    labels = _labels(disc.config) if kind and kind.component in (
        "classification_head", "token_head") else None
    sizes = {c: symbols(fields, vocab_size, len(labels) if labels else 0) for c in components}
    params = expand(components, sizes, head_name, family.rows)
    state = rename(disc.weights, params, to_hf=False, where=discriminator_dir)
    permute_rows(state, params, to_hf=False, fairseq_index=index)

    # ModernBERT's heads may pool the mean of the tokens, as --classifier-pooling mean
    pooling = "mean" if disc.config.get("classifier_pooling") == "mean" else "first"
    model_cfg = dict(_name="electra", **fields, encoder_body=family.body,
                     classifier_pooling=pooling,
                     generator_size=_default_generator_size(fields["num_heads"]),
                     generator_layers=None, embedding_sharing=None,
                     load_checkpoint_heads=kind is not None and
                     kind_of_fairseq_task(kind.task).heads_from_checkpoint,
                     # HF/official ELECTRA: type 1 on the second segment, unless the
                     # tokenizer gives pairs another (an export of a model without them)
                     segment_token_types=fields["type_vocab_size"] > 1 and
                     pair_token_type(discriminator_dir) != 0)
    if generator_dir is not None:
        pretraining_class = family.pretraining_class
        if disc.architecture != pretraining_class:
            bare = pretraining_class == family.prefix + "Model"
            raise ElectraUsageError(
                f"{discriminator_dir} is an {disc.architecture}, not {pretraining_class}; a "
                f"pre-training checkpoint (with a generator) needs "
                f"{'the bare discriminator' if bare else 'the replaced-token head'}")
        generator_dir = os.fspath(generator_dir)
        gen_state, model_cfg["generator_size"], model_cfg["generator_layers"], untied = \
            _import_generator(generator_dir, disc, fields, tokens, index)
        model_cfg["embedding_sharing"] = "untied" if untied else None
        if "discriminator_head.dense.weight" not in state:
            state.update(_fresh_discriminator_head(fields["hidden_size"]))
            logger.info(f"{family.prefix} has no replaced-token head: the checkpoint gets a new "
                        f"one, initialised as pre-training initialises it")
        if not untied:  # one shared block: store its tensors once
            gen_state.update({k: state["discriminator" + k[len("generator"):]]
                              for k in gen_state if k.startswith("generator.embeddings.")})
        state.update(gen_state)

    managed = ("checkpoint.pt", "dict.txt", "vocab.txt", "tokenizer.json", METADATA_FILE,
               HF_ORDER, LABELS_FILE) + tuple(HF_COPY + name for name in HF_TOKENIZER_FILES)
    prepare_out_dir(out_dir, overwrite, managed)
    dict_path = os.path.join(out_dir, "dict.txt")
    vocab_path = os.path.join(out_dir, "vocab.txt")
    if other is not None:  # the renumbered tokenizer.json describes the dictionary
        other[0].save(os.path.join(out_dir, "tokenizer.json"))
        described = TokenizersTextTokenizer(os.path.join(out_dir, "tokenizer.json"))
        with open(dict_path, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(line + "\n" for line in described.dict_lines())
        described.save_metadata(out_dir)
        _keep_hf_order(discriminator_dir, out_dir, index)
    else:  # the entries as BERT reads them, placeholders included
        with open(vocab_path, "w", encoding="utf-8", newline="\n") as f:
            f.write("".join(token + "\n" for token in tokens))
    if other is None:
        write_fairseq_dict(vocab_path, dict_path)
        from ..data.dictionary import load_dictionary

        dictionary = load_dictionary(out_dir)
        check_dictionary(dictionary, tokens, index, dict_path)
        tok_cfg = read_tokenizer_settings(discriminator_dir)
        WordPieceTextTokenizer(vocab_path, lowercase=tok_cfg["do_lower_case"],
                               strip_accents=tok_cfg["strip_accents"],
                               tokenize_chinese_chars=tok_cfg["tokenize_chinese_chars"],
                               vocab_file="vocab.txt").save_metadata(out_dir)

    pretraining = generator_dir is not None
    task_cfg = _task_config(kind, "electra" if pretraining else "masked_lm", out_dir, fields,
                            head_name, labels)
    checkpoint = write_checkpoint(
        os.path.join(out_dir, "checkpoint.pt"), model_cfg, task_cfg, state,
        criterion_cfg={"_name": "electra"} if pretraining else None, overwrite=True)
    logger.info(f"imported {discriminator_dir}"
                f"{' + ' + generator_dir if generator_dir else ''} -> {checkpoint}")
    return ImportResult(checkpoint, dict_path, model_cfg, task_name(task_cfg))


def _fresh_discriminator_head(hidden: int) -> Dict[str, torch.Tensor]:
    """The replaced-token head's tensors as BERT initialises them (N(0, 0.02), zero bias)."""
    gen = torch.Generator().manual_seed(0)
    return {"discriminator_head.dense.weight": torch.randn(hidden, hidden, generator=gen) * 0.02,
            "discriminator_head.dense.bias": torch.zeros(hidden),
            "discriminator_head.dense_prediction.weight":
                torch.randn(1, hidden, generator=gen) * 0.02,
            "discriminator_head.dense_prediction.bias": torch.zeros(1)}


def _keep_hf_order(model_dir: str, out_dir: str, index: torch.Tensor) -> None:
    """Store what an export needs to give back HF's ids: the rows' HF order, its tokenizer."""
    with open(os.path.join(out_dir, HF_ORDER), "w", encoding="utf-8") as f:
        json.dump({"fairseq_row_of_hf_id": index.tolist()}, f)
    for name in HF_TOKENIZER_FILES:
        if os.path.isfile(os.path.join(model_dir, name)):
            shutil.copyfile(os.path.join(model_dir, name), os.path.join(out_dir, HF_COPY + name))


def _import_generator(generator_dir, disc: _HFModel, fields: dict, tokens, index):
    """(fairseq state, generator_size, generator_layers, untied embeddings) of an HF
    generator."""
    gen = _HFModel.read(generator_dir)
    family = disc.family
    if gen.family is not family:
        raise ElectraUsageError(f"{generator_dir} is a {gen.family.model_type} model, the "
                                f"discriminator a {family.model_type} one; both must be the same "
                                f"body")
    if gen.architecture != family.prefix + "ForMaskedLM":
        raise ElectraUsageError(f"{generator_dir} is an {gen.architecture}, not a generator "
                                f"({family.prefix}ForMaskedLM)")
    if _embedding_rows(gen) != len(tokens):
        raise ElectraUsageError(f"{generator_dir}: vocab_size {gen.config['vocab_size']} differs "
                                f"from the discriminator's {len(tokens)}")
    if any(os.path.isfile(os.path.join(generator_dir, name))
           for name in ("vocab.txt", "tokenizer.json")):
        other = _renumbered_tokenizer(generator_dir, len(tokens))
        theirs = _read_vocab(generator_dir, len(tokens))[0] if other is None else \
            [other[0].id_to_token(i) for i in range(len(other[1]))]
        if theirs != list(tokens):
            raise ElectraUsageError(f"{generator_dir}: the generator's vocabulary differs from "
                                    f"the discriminator's")
    gen_fields = family.fields_from_hf(gen.config)
    for field in SHARED_ENCODER_FIELDS:
        if gen_fields[field] != fields[field]:
            theirs = dict(CONFIG_TABLE)[field]
            raise ElectraUsageError(
                f"{generator_dir}: generator {theirs} {gen_fields[field]} differs from the "
                f"discriminator's {fields[field]}; the plugin's generator shares it")
    for field in ("dropout", "attention_dropout"):
        if gen_fields[field] != fields[field]:
            logger.warning(f"generator {field} {gen_fields[field]} differs from the "
                           f"discriminator's; the checkpoint uses {fields[field]} for both")
    generator_size = _fit_generator_size(fields, gen_fields, generator_dir)
    generator_layers = _fit_generator_layers(fields, gen_fields, generator_dir)
    weights = dict(gen.weights)
    tied_output, tied_to = family.tied_output
    lm_weight = weights.pop(tied_output, None)
    embeddings = weights.get(tied_to)
    if lm_weight is not None and embeddings is not None and not (
            lm_weight.shape == embeddings.shape and torch.equal(lm_weight, embeddings)):
        raise ElectraUsageError(
            f"{generator_dir}: {tied_output} differs from the word embeddings; the "
            f"plugin's generator output layer is tied to them (tie_word_embeddings)")
    shared = [k for k in disc.weights if k.startswith(family.base + "embeddings.")]
    tied = all(k in weights and weights[k].shape == disc.weights[k].shape
               and torch.equal(weights[k], disc.weights[k]) for k in shared)
    gen_fields = _generator_fields(fields, generator_size, generator_layers)
    components = family.architectures[gen.architecture]
    sizes = {c: symbols(gen_fields, len(tokens)) for c in components}
    params = expand(components, sizes, rows=family.rows)
    state = rename(weights, params, to_hf=False, where=generator_dir)
    permute_rows(state, params, to_hf=False, fairseq_index=index)
    logger.info(f"generator size {generator_size:g}, {gen_fields['num_layers']} layers, "
                f"embeddings {'shared with' if tied else 'separate from'} the discriminator's")
    return state, generator_size, generator_layers, not tied


def _labels(config: dict) -> List[str]:
    """The class names of an HF classifier, in id order (LABEL_i when it has none)."""
    id2label = config.get("id2label") or {}
    count = len(id2label) if id2label else int(config.get("num_labels", 2))
    return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(count)]


def _task_config(kind: Optional[HeadKind], default: str, out_dir: str, fields: dict,
                 head_name: str, labels):
    """The imported checkpoint's task: the one its head's fine-tuning kind gives (token_tagging
    over ``out_dir`` with its labels.txt, squad 1.1, sentence_ranking ...), else ``default``
    (masked_lm: the same dictionary, no data files needed; sentence heads load into
    sentence_prediction runs from it)."""
    found = None if kind is None else \
        kind_of_fairseq_task(kind.task).imported_task(out_dir, head_name, fields, labels)
    return found if found is not None else {
        "_name": default, "data": os.path.abspath(out_dir),
        "tokens_per_sample": min(512, fields["max_positions"])}
