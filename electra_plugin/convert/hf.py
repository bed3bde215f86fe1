"""ELECTRA checkpoints between this plugin and Hugging Face ``transformers``: the HF files.

Tensor names, shapes and the vocabulary permutation come from :mod:`.keys`; this module
reads and writes the HF directories (``config.json`` and the tokenizer files through
``transformers`` itself, the weights as ``model.safetensors``) and the plugin's checkpoint,
dictionary and tokenizer description.

Decisions:

* Both directions need ``transformers`` (the ``hf`` extra): it fills in the defaults of a
  ``config.json`` on import and writes ``config.json`` and the tokenizer files on export.
* Import reads ``model.safetensors`` or ``pytorch_model.bin`` (sharded or not) and stores
  fp32. The generator's output layer must be tied to its word embeddings (as in ELECTRA and
  in HF's ``ElectraForMaskedLM``). Generator and discriminator share the embedding block
  exactly when every embedding tensor of the two is equal; otherwise the checkpoint gets
  ``embedding_sharing=untied``. A generator shallower than the discriminator gets
  ``generator_layers`` (its depth as a fraction of the discriminator's).
* A GDES checkpoint (``--embedding-sharing gdes``) exports a plain discriminator: its token
  embeddings are the generator's plus the residual, folded into one table (the import of
  such an export gives ``embedding_sharing=untied``).
* Export needs the dictionary the model was trained with (``--data``, default: the
  checkpoint's ``task.data``). When the dictionary came from a WordPiece vocab.txt (found
  through ``electra_tokenizer.json``, as ``vocab.txt`` next to ``dict.txt``, or given
  explicitly) the HF rows follow that vocab.txt and the tokenizer is transformers'
  ``BertTokenizerFast``. A sentencepiece dictionary keeps fairseq's row order and gets a
  ``tokenizer.json`` in those ids (:mod:`electra_plugin.data.fast_tokenizer`) with
  ``<s> </s> <pad> <unk> <mask>`` as transformers' special tokens, next to ``dict.txt``
  and ``spm.model``. A dictionary imported from a non-WordPiece HF checkpoint exports in
  HF's ids with its original tokenizer files (kept by the import as ``hf_order.json`` and
  ``hf_tokenizer*.json``), so import then export gives the checkpoint back bit for bit.
  Only a dictionary with no tokenizer description exports without
  tokenizer files (a note, VOCABULARY.md, says how ids are numbered).
* A model without token types (``type_vocab_size=0``) is exported with one all-zero token
  type row, which HF adds to every token: the same numbers.
"""

import json
import logging
import math
import os
import shutil
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer
from tokenizers.models import WordPiece
from tokenizers.normalizers import BertNormalizer

from ..models.core.checkpoint import load_checkpoint, refused_pickle_error, write_checkpoint
from ..data.conll import LABELS_FILE
from ..optional import require
from ..data import fast_tokenizer
from ..data.tokenizer import (METADATA_FILE, TokenizersTextTokenizer, WordPieceTextTokenizer,
                              tokenizer_from_metadata)
from ..data.wordpiece import BERT_SPECIAL_TOKENS, load_vocab, vocab_to_fairseq_indices
from ..data.wordpiece import write_fairseq_dict
from ..errors import ElectraUsageError, first_line
from ..output_dir import refuse_existing
from ..partial_output import removed_on_failure, unusable_destination
from ..models.generators import GENERATORS
from ..models.core.config import SIZE_FIELDS, EncoderSize, complete_config, scaled_size
from ..models.electra import BOOKKEEPING_KEYS, fold_embedding_delta
from .keys import (CONFIG_TABLE, HF_ARCHITECTURES, component_of, expand, permute_rows, rename,
                   symbols)

logger = logging.getLogger(__name__)

__all__ = ["from_hf", "to_hf", "model_cli_args"]

DEFAULT_HEAD = "sentence_classification_head"
# transformers' names of the roles of ids 0-3 and of <mask> (the last id)
# An imported non-WordPiece checkpoint keeps HF's id order for its export (the dictionary
# is in fairseq's): HF id -> fairseq row, and the HF tokenizer files, stored with this prefix.
_HF_ORDER = "hf_order.json"
_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_HF_COPY = "hf_"
_SPECIAL_ROLES = ("bos_token", "pad_token", "eos_token", "unk_token", "mask_token")  # fairseq's --classification-head-name default
# Non-persistent buffers that transformers 4.x wrote into some checkpoints: not parameters.
_HF_BUFFERS = ("electra.embeddings.position_ids", "electra.embeddings.token_type_ids")
_TIED_LM_WEIGHT = ("generator_lm_head.weight", "electra.embeddings.word_embeddings.weight")
# What the plugin's encoder computes; anything else in a config.json is an error.
LAYER_NORM_EPS = 1e-12
HIDDEN_ACT = "gelu"
_SHARED_ENCODER_FIELDS = ("embedding_size", "max_positions", "type_vocab_size")


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise ElectraUsageError(f"cannot read {path}: {e}")
    if not isinstance(value, dict):
        raise ElectraUsageError(f"{path} is not a JSON object")
    return value


def read_hf_config(model_dir: str) -> dict:
    """config.json of an HF ELECTRA directory, with defaults filled and unsupported settings
    rejected."""
    if not os.path.isdir(model_dir):
        raise ElectraUsageError(f"{model_dir} is not a directory (expected a Hugging Face model "
                                f"directory written by save_pretrained)")
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise ElectraUsageError(f"{model_dir} has no config.json; is it a Hugging Face model "
                                f"directory (written by save_pretrained)?")
    config = _read_json(path)
    if config.get("model_type") != "electra":
        raise ElectraUsageError(f"{path} describes a '{config.get('model_type')}' model, not "
                                f"ELECTRA (model_type must be 'electra')")
    try:  # transformers fills in its defaults (and id2label from num_labels)
        config = _transformers().ElectraConfig.from_dict(config).to_dict()
    except (TypeError, ValueError) as e:
        raise ElectraUsageError(f"{path}: {first_line(e)}")
    if config["hidden_act"] != HIDDEN_ACT:
        raise ElectraUsageError(f"{path}: hidden_act '{config['hidden_act']}' is not supported; "
                                f"the plugin's ELECTRA uses '{HIDDEN_ACT}' (exact GELU)")
    if not math.isclose(float(config["layer_norm_eps"]), LAYER_NORM_EPS, rel_tol=1e-6):
        raise ElectraUsageError(f"{path}: layer_norm_eps {config['layer_norm_eps']} is not "
                                f"supported; the plugin's ELECTRA uses {LAYER_NORM_EPS}")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ElectraUsageError(f"{path}: position_embedding_type "
                                f"'{config['position_embedding_type']}' is not supported "
                                f"(only 'absolute')")
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise ElectraUsageError(f"{path}: decoder ELECTRA models (is_decoder / "
                                f"add_cross_attention) are not supported")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise ElectraUsageError(f"{path}: hidden_size {config['hidden_size']} is not divisible "
                                f"by num_attention_heads {config['num_attention_heads']}")
    return config


def _fields_from_hf(config: dict) -> Dict[str, float]:
    return {ours: config[theirs] for ours, theirs in CONFIG_TABLE}


def _transformers():
    """transformers, which fills in, writes and reads the HF config and tokenizer files."""
    return require("converting to or from Hugging Face transformers")


def _hf_config(fields: dict, architecture: str, vocab_size: int, pad_token_id: int,
               dtype: torch.dtype, labels: Optional[Sequence[str]] = None):
    """The transformers ``ElectraConfig`` of one encoder."""
    extra = {}
    if labels is not None:
        extra = {"id2label": dict(enumerate(labels)),
                 "label2id": {label: i for i, label in enumerate(labels)}}
    return _transformers().ElectraConfig(
        architectures=[architecture], vocab_size=vocab_size, pad_token_id=pad_token_id,
        dtype=dtype, hidden_act=HIDDEN_ACT, layer_norm_eps=LAYER_NORM_EPS,
        **{theirs: fields[ours] for ours, theirs in CONFIG_TABLE}, **extra)


def _generator_fields(fields: dict, generator_size: float,
                      generator_layers: Optional[float]) -> dict:
    """Our generator's per-encoder fields, from the discriminator's and the size fractions."""
    disc = EncoderSize(*(fields[k] for k in SIZE_FIELDS))
    return _encoder_fields(fields, scaled_size(disc, generator_size, generator_layers))


def _encoder_fields(fields: dict, size: EncoderSize) -> dict:
    """The per-encoder fields of an encoder of ``size``, the others as ``fields``."""
    return dict(fields, num_layers=size.layers, hidden_size=size.hidden, num_heads=size.heads,
                ffn_size=size.ffn)


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


# ------------------------------------------------------------------------- HF directories
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
# Files an export writes (and, with overwrite, replaces) in each model directory.
_EXPORT_FILES = _WEIGHT_FILES + ("config.json", "vocab.txt", "tokenizer_config.json",
                                 "special_tokens_map.json", "tokenizer.json", "dict.txt",
                                 "spm.model", "VOCABULARY.md")


def _load_weight_file(path: str) -> Dict[str, torch.Tensor]:
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(path)
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt file, not a weights file, pickled objects
        raise refused_pickle_error(path, e) or \
            ElectraUsageError(f"cannot read weights {path}: {first_line(e)}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ElectraUsageError(f"{path} is not a state dict of tensors")
    return state


def read_hf_weights(model_dir: str) -> Dict[str, torch.Tensor]:
    """All tensors of an HF directory: model.safetensors or pytorch_model.bin, maybe sharded."""
    for name in _WEIGHT_FILES:
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            break
    else:
        raise ElectraUsageError(f"{model_dir} has no weights (model.safetensors or "
                                f"pytorch_model.bin)")
    if not name.endswith(".index.json"):
        return _load_weight_file(path)
    weight_map = _read_json(path).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ElectraUsageError(f"{path} has no weight_map")
    state = {}
    for shard in sorted(set(weight_map.values())):
        state.update(_load_weight_file(os.path.join(model_dir, shard)))
    return state


# the HF classes an import reads (a token classifier is exported, not yet imported)
IMPORTED = [a for a in HF_ARCHITECTURES if a != "ElectraForTokenClassification"]


def _detect_architecture(config: dict, weights: Dict[str, torch.Tensor], where: str) -> str:
    archs = [a for a in config.get("architectures") or [] if a]
    if archs and archs[0] not in IMPORTED:
        raise ElectraUsageError(f"{where}: {archs[0]} is not supported; convert one of "
                                f"{', '.join(IMPORTED)}")
    for arch, marker in (("ElectraForMaskedLM", "generator_predictions."),
                         ("ElectraForMaskedLM", "generator_lm_head."),
                         ("ElectraForPreTraining", "discriminator_predictions."),
                         ("ElectraForSequenceClassification", "classifier.")):
        if any(k.startswith(marker) for k in weights):
            return arch
    return "ElectraModel"


@dataclass
class _HFModel:
    path: str
    config: dict
    weights: Dict[str, torch.Tensor]  # keys with the "electra." prefix, buffers dropped
    architecture: str

    @classmethod
    def read(cls, model_dir: str) -> "_HFModel":
        config = read_hf_config(model_dir)
        weights = read_hf_weights(model_dir)
        architecture = _detect_architecture(config, weights, model_dir)
        if architecture == "ElectraModel" and not any(k.startswith("electra.") for k in weights):
            weights = {"electra." + k: v for k, v in weights.items()}  # base model: no prefix
        weights = {k: v for k, v in weights.items() if k not in _HF_BUFFERS}
        return cls(model_dir, config, weights, architecture)


def _read_vocab(model_dir: str) -> Tuple[List[str], torch.Tensor]:
    """WordPiece entries of an HF directory and, per entry, its fairseq dictionary index.

    Reads vocab.txt, or else the WordPiece model of a tokenizer.json (what transformers 5
    writes instead of vocab.txt).
    """
    path = os.path.join(model_dir, "vocab.txt")
    if os.path.isfile(path):
        tokens = load_vocab(path)
    else:
        tokens = _tokenizer_json_vocab(model_dir)
        path = os.path.join(model_dir, "tokenizer.json")
    index = vocab_to_fairseq_indices(tokens)
    if sorted(index) != list(range(len(tokens))):
        twice = [t for t in BERT_SPECIAL_TOKENS if tokens.count(t) > 1]
        raise ElectraUsageError(f"{path} lists {', '.join(twice) or 'a special token'} more "
                                f"than once; a fairseq dictionary has one row per special")
    return tokens, torch.tensor(index)


def _fast_tokenizer(model_dir: str) -> Optional[Tokenizer]:
    """The ``tokenizers`` tokenizer saved as tokenizer.json in an HF directory, or None."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a plain Exception for a malformed file
        raise ElectraUsageError(f"cannot read {path}: {first_line(e)}")


def _tokenizer_json_vocab(model_dir: str) -> List[str]:
    path = os.path.join(model_dir, "tokenizer.json")
    tokenizer = _fast_tokenizer(model_dir)
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


def _renumbered_tokenizer(model_dir: str):
    """(tokenizer.json renumbered to fairseq's order, HF id -> fairseq row) of a checkpoint
    whose tokenizer is not WordPiece (sentencepiece/Unigram, BPE, ...), or None."""
    tokenizer = _fast_tokenizer(model_dir)
    if tokenizer is None or isinstance(tokenizer.model, WordPiece) or \
            os.path.isfile(os.path.join(model_dir, "vocab.txt")):
        return None
    try:
        hf = _transformers().AutoTokenizer.from_pretrained(model_dir)
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
    try:
        renumbered, new_of = fast_tokenizer.renumbered(tokenizer, roles)
    except ElectraUsageError as e:
        raise ElectraUsageError(f"{model_dir}: {e}") from None
    return renumbered, torch.tensor(new_of)


def _check_dictionary(dictionary, tokens: Sequence[str], index: torch.Tensor, where: str):
    """The fairseq dictionary must hold vocab.txt's rows at ``index`` (specials by role)."""
    role = {"[CLS]": dictionary.bos_word, "[PAD]": dictionary.pad_word,
            "[SEP]": dictionary.eos_word, "[UNK]": dictionary.unk_word, "[MASK]": "<mask>"}
    if len(dictionary) != len(tokens):
        raise ElectraUsageError(f"{where}: the dictionary has {len(dictionary)} entries (with "
                                f"<mask>) but vocab.txt {len(tokens)}; they are not the same "
                                f"vocabulary")
    for row, (token, i) in enumerate(zip(tokens, index.tolist())):
        if dictionary.symbols[i] != role.get(token, token):
            raise ElectraUsageError(
                f"{where}: vocab.txt line {row + 1} ({token!r}) is {dictionary.symbols[i]!r} in "
                f"the dictionary; the dictionary was not made from this vocab.txt")


def _prepare_out_dir(out_dir: str, overwrite: bool, managed: Sequence[str]) -> None:
    """Refuse a directory that holds files; with overwrite, remove the files we write."""
    refuse_existing(out_dir, overwrite)
    for name in managed:
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            os.remove(path)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise unusable_destination(f"cannot create {out_dir}", e) from None


# -------------------------------------------------------------------------------- import
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
    args = ["--arch", "electra"]
    for field in ("num_layers", "hidden_size", "num_heads", "ffn_size", "embedding_size",
                  "generator_size", "generator_layers", "max_positions", "type_vocab_size",
                  "dropout", "attention_dropout", "embedding_sharing"):
        if model_cfg.get(field) is not None:
            args += ["--" + field.replace("_", "-"), str(model_cfg[field])]
    if model_cfg.get("segment_token_types"):
        args.append("--segment-token-types")
    return args


def _default_generator_size(num_heads: int) -> float:
    """A valid placeholder for discriminator-only checkpoints: about 1/4, whole heads."""
    return max(1, round(num_heads / 4)) / num_heads


def from_hf(discriminator_dir, generator_dir=None, *, out_dir,
            head_name: str = DEFAULT_HEAD, overwrite: bool = False) -> ImportResult:
    """Hugging Face ELECTRA directory(ies) -> ``out_dir/{checkpoint.pt,dict.txt,vocab.txt}``.

    Args:
        discriminator_dir: ``ElectraForPreTraining``, ``ElectraModel`` or
            ``ElectraForSequenceClassification`` (config.json, weights, vocab.txt).
        generator_dir: optional ``ElectraForMaskedLM``; with it the checkpoint is a
            pre-training one (task ``electra``: generator, discriminator, replaced-token
            head) and the discriminator must be an ``ElectraForPreTraining``.
        out_dir: an empty (or new) directory; it also becomes the checkpoint's data
            directory (``dict.txt`` and ``electra_tokenizer.json`` to encode text with).
        head_name: fairseq name of an imported sequence classification head.
        overwrite: replace the files a previous import wrote there.

    Without a generator the checkpoint is discriminator-only (task ``masked_lm``, which
    loads the same dictionary): for fine-tuning with ``--restore-file``/``--finetune-from-model``
    or ``load_model_ensemble_and_task``.
    """
    discriminator_dir, out_dir = os.fspath(discriminator_dir), os.fspath(out_dir)
    disc = _HFModel.read(discriminator_dir)
    if disc.architecture == "ElectraForMaskedLM":
        raise ElectraUsageError(
            f"{discriminator_dir} is a generator (ElectraForMaskedLM); give the discriminator "
            f"(ElectraForPreTraining) first and the generator as the generator")
    other = _renumbered_tokenizer(discriminator_dir)  # None: WordPiece
    if other is None:
        tokens, index = _read_vocab(discriminator_dir)
    else:
        index = other[1]
        tokens = [other[0].id_to_token(i) for i in range(len(index))]
    vocab_size = len(tokens)
    if disc.config["vocab_size"] != vocab_size:
        raise ElectraUsageError(f"{discriminator_dir}: config.json has vocab_size "
                                f"{disc.config['vocab_size']} but vocab.txt {vocab_size} entries")
    fields = _fields_from_hf(disc.config)
    components = HF_ARCHITECTURES[disc.architecture]
    num_classes = 0
    if "classification_head" in components:
        id2label = disc.config.get("id2label")
        num_classes = len(id2label) if id2label else int(disc.config.get("num_labels", 2))
    sizes = {c: symbols(fields, vocab_size, num_classes) for c in components}
    params = expand(components, sizes, head_name)
    state = rename(disc.weights, params, to_hf=False, where=discriminator_dir)
    permute_rows(state, params, to_hf=False, fairseq_index=index)

    model_cfg = dict(_name="electra", **fields,
                     generator_size=_default_generator_size(fields["num_heads"]),
                     generator_layers=None, embedding_sharing=None,
                     load_checkpoint_heads="classification_head" in components,
                     # HF/official ELECTRA: type 1 on the second segment in pre-training
                     segment_token_types=fields["type_vocab_size"] > 1)
    if generator_dir is not None:
        if disc.architecture != "ElectraForPreTraining":
            raise ElectraUsageError(
                f"{discriminator_dir} is an {disc.architecture}, not ElectraForPreTraining; a "
                f"pre-training checkpoint (with a generator) needs the replaced-token head")
        generator_dir = os.fspath(generator_dir)
        gen_state, model_cfg["generator_size"], model_cfg["generator_layers"], untied = \
            _import_generator(generator_dir, disc, fields, tokens, index)
        model_cfg["embedding_sharing"] = "untied" if untied else None
        if not untied:  # one shared block: store its tensors once
            gen_state.update({k: state["discriminator" + k[len("generator"):]]
                              for k in gen_state if k.startswith("generator.embeddings.")})
        state.update(gen_state)

    managed = ("checkpoint.pt", "dict.txt", "vocab.txt", "tokenizer.json", METADATA_FILE,
               _HF_ORDER) + tuple(_HF_COPY + name for name in _HF_TOKENIZER_FILES)
    _prepare_out_dir(out_dir, overwrite, managed)
    dict_path = os.path.join(out_dir, "dict.txt")
    vocab_path = os.path.join(out_dir, "vocab.txt")
    if other is not None:  # the renumbered tokenizer.json describes the dictionary
        other[0].save(os.path.join(out_dir, "tokenizer.json"))
        described = TokenizersTextTokenizer(os.path.join(out_dir, "tokenizer.json"))
        with open(dict_path, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(line + "\n" for line in described.dict_lines())
        described.save_metadata(out_dir)
        _keep_hf_order(discriminator_dir, out_dir, index)
    elif os.path.isfile(os.path.join(discriminator_dir, "vocab.txt")):
        shutil.copyfile(os.path.join(discriminator_dir, "vocab.txt"), vocab_path)
    else:
        with open(vocab_path, "w", encoding="utf-8", newline="\n") as f:
            f.write("".join(token + "\n" for token in tokens))
    if other is None:
        write_fairseq_dict(vocab_path, dict_path)
        from ..data.dictionary import load_dictionary

        dictionary = load_dictionary(out_dir)
        _check_dictionary(dictionary, tokens, index, dict_path)
        tok_cfg = _tokenizer_settings(discriminator_dir)
        WordPieceTextTokenizer(vocab_path, lowercase=tok_cfg["do_lower_case"],
                               strip_accents=tok_cfg["strip_accents"],
                               tokenize_chinese_chars=tok_cfg["tokenize_chinese_chars"],
                               vocab_file="vocab.txt").save_metadata(out_dir)

    pretraining = generator_dir is not None
    task_cfg = {"_name": "electra" if pretraining else "masked_lm",
                "data": os.path.abspath(out_dir),
                "tokens_per_sample": min(512, fields["max_positions"])}
    checkpoint = write_checkpoint(
        os.path.join(out_dir, "checkpoint.pt"), model_cfg, task_cfg, state,
        criterion_cfg={"_name": "electra"} if pretraining else None, overwrite=True)
    logger.info(f"imported {discriminator_dir}"
                f"{' + ' + generator_dir if generator_dir else ''} -> {checkpoint}")
    return ImportResult(checkpoint, dict_path, model_cfg, task_cfg["_name"])


def _keep_hf_order(model_dir: str, out_dir: str, index: torch.Tensor) -> None:
    """Store what an export needs to give back HF's ids: the rows' HF order, its tokenizer."""
    with open(os.path.join(out_dir, _HF_ORDER), "w", encoding="utf-8") as f:
        json.dump({"fairseq_row_of_hf_id": index.tolist()}, f)
    for name in _HF_TOKENIZER_FILES:
        if os.path.isfile(os.path.join(model_dir, name)):
            shutil.copyfile(os.path.join(model_dir, name), os.path.join(out_dir, _HF_COPY + name))


def _hf_order(tok_dir: str, dictionary) -> Optional[torch.Tensor]:
    """HF id -> fairseq row of a dictionary imported from a non-WordPiece checkpoint, or None."""
    path = os.path.join(tok_dir, _HF_ORDER)
    if not os.path.isfile(path):
        return None
    rows = _read_json(path).get("fairseq_row_of_hf_id")
    if not isinstance(rows, list) or sorted(rows) != list(range(len(dictionary))):
        raise ElectraUsageError(f"{path} does not order the {len(dictionary)} rows of "
                                f"{tok_dir}/dict.txt; remove it to export in fairseq's order")
    return torch.tensor(rows)


def _import_generator(generator_dir, disc: _HFModel, fields: dict, tokens, index):
    """(fairseq state, generator_size, generator_layers, untied embeddings) of an HF
    generator."""
    gen = _HFModel.read(generator_dir)
    if gen.architecture != "ElectraForMaskedLM":
        raise ElectraUsageError(f"{generator_dir} is an {gen.architecture}, not a generator "
                                f"(ElectraForMaskedLM)")
    if any(os.path.isfile(os.path.join(generator_dir, name))
           for name in ("vocab.txt", "tokenizer.json")):
        other = _renumbered_tokenizer(generator_dir)
        theirs = _read_vocab(generator_dir)[0] if other is None else \
            [other[0].id_to_token(i) for i in range(len(other[1]))]
        if theirs != list(tokens):
            raise ElectraUsageError(f"{generator_dir}: the generator's vocabulary differs from "
                                    f"the discriminator's")
    if gen.config["vocab_size"] != len(tokens):
        raise ElectraUsageError(f"{generator_dir}: vocab_size {gen.config['vocab_size']} differs "
                                f"from the discriminator's {len(tokens)}")
    gen_fields = _fields_from_hf(gen.config)
    for field in _SHARED_ENCODER_FIELDS:
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
    lm_weight = weights.pop(_TIED_LM_WEIGHT[0], None)
    embeddings = weights.get(_TIED_LM_WEIGHT[1])
    if lm_weight is not None and embeddings is not None and not (
            lm_weight.shape == embeddings.shape and torch.equal(lm_weight, embeddings)):
        raise ElectraUsageError(
            f"{generator_dir}: generator_lm_head.weight differs from the word embeddings; the "
            f"plugin's generator output layer is tied to them (tie_word_embeddings)")
    shared = [k for k in disc.weights if k.startswith("electra.embeddings.")]
    tied = all(k in weights and weights[k].shape == disc.weights[k].shape
               and torch.equal(weights[k], disc.weights[k]) for k in shared)
    gen_fields = _generator_fields(fields, generator_size, generator_layers)
    components = HF_ARCHITECTURES[gen.architecture]
    sizes = {c: symbols(gen_fields, len(tokens)) for c in components}
    params = expand(components, sizes)
    state = rename(weights, params, to_hf=False, where=generator_dir)
    permute_rows(state, params, to_hf=False, fairseq_index=index)
    logger.info(f"generator size {generator_size:g}, {gen_fields['num_layers']} layers, "
                f"embeddings {'shared with' if tied else 'separate from'} the discriminator's")
    return state, generator_size, generator_layers, not tied


def _tokenizer_settings(model_dir: str) -> dict:
    """do_lower_case etc. from an HF tokenizer_config.json (BERT's defaults otherwise)."""
    settings = {"do_lower_case": True, "strip_accents": None, "tokenize_chinese_chars": True}
    tokenizer = _fast_tokenizer(model_dir)
    if tokenizer is not None and isinstance(tokenizer.normalizer, BertNormalizer):
        normalizer = tokenizer.normalizer
        settings.update(do_lower_case=normalizer.lowercase,
                        strip_accents=normalizer.strip_accents,
                        tokenize_chinese_chars=normalizer.handle_chinese_chars)
    path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.isfile(path):
        config = _read_json(path)
        settings.update({k: config[k] for k in settings if k in config})
    return settings


# -------------------------------------------------------------------------------- export
@dataclass
class ExportResult:
    discriminator_dir: str
    architecture: str
    generator_dir: Optional[str]
    wordpiece_vocab: bool  # False: rows in fairseq dictionary order, no vocab.txt
    hf_tokenizer: bool  # False: no tokenizer files (see VOCABULARY.md)


def _find_dictionary(cfg, data: Optional[str]):
    """(dictionary with <mask>, the directory of its dict.txt)."""
    from ..data.dictionary import load_dictionary

    if data is None:
        data = cfg.task.get("data", None)
        data = str(data).split(":")[0] if data else None
    if not data:
        raise ElectraUsageError("the checkpoint names no data directory; pass the directory "
                                "with the dict.txt it was trained with (--data)")
    input0 = os.path.join(data, "input0")  # sentence_prediction's layout
    if not os.path.isfile(os.path.join(data, "dict.txt")) and \
            os.path.isfile(os.path.join(input0, "dict.txt")):
        data = input0
    return load_dictionary(data), data


def _tokenizer_dir(dict_dir: str) -> str:
    """Where the tokenizer description of a dictionary is: next to it, or for fine-tuning
    data (input0/dict.txt) one level up, where electra-glue and electra-squad put it."""
    parent = os.path.dirname(os.path.normpath(dict_dir))
    if not os.path.isfile(os.path.join(dict_dir, METADATA_FILE)) and \
            os.path.basename(os.path.normpath(dict_dir)) == "input0" and \
            os.path.isfile(os.path.join(parent, METADATA_FILE)):
        return parent
    return dict_dir


def _find_vocab(dict_dir: str, vocab: Optional[str]):
    """(vocab.txt path or None, tokenizer settings, electra_tokenizer.json contents).

    None means the dictionary did not come from a WordPiece vocabulary we can find.
    """
    meta = {}
    meta_path = os.path.join(dict_dir, METADATA_FILE)
    if os.path.isfile(meta_path):
        meta = _read_json(meta_path)
    settings = {"do_lower_case": bool(meta.get("lowercase", True)),
                "strip_accents": meta.get("strip_accents"),
                "tokenize_chinese_chars": bool(meta.get("tokenize_chinese_chars", True))}
    if vocab is not None:
        if not os.path.isfile(vocab):
            raise ElectraUsageError(f"vocabulary {vocab} does not exist")
        return vocab, settings, meta
    candidates = []
    if meta.get("type") == "wordpiece":
        candidates.append(os.path.join(dict_dir, meta.get("vocab", "vocab.txt")))
    if meta.get("type") in (None, "wordpiece"):
        candidates.append(os.path.join(dict_dir, "vocab.txt"))
    for path in candidates:
        if os.path.isfile(path):
            return path, settings, meta
    return None, settings, meta


def _write_model_dir(model_dir, hf_state, config, vocab_path, tokenizer_settings,
                     dict_dir, spm_path=None, fast=None, hf_tok_dir=None):
    from safetensors.torch import save_file

    os.makedirs(model_dir, exist_ok=True)
    # safetensors directly: save_pretrained of a model would first build it, to write the same
    save_file({k: v.detach().contiguous() for k, v in hf_state.items()},
              os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(model_dir)
    if vocab_path is not None:
        _transformers().BertTokenizerFast(
            os.fspath(vocab_path), model_max_length=config.max_position_embeddings,
            **tokenizer_settings,
        ).save_pretrained(model_dir)
        # vocab.txt as well: every row, repeated entries included (tokenizer.json holds a map)
        shutil.copyfile(vocab_path, os.path.join(model_dir, "vocab.txt"))
        return
    if hf_tok_dir is not None:  # the imported checkpoint's own tokenizer files, as they were
        for name in _HF_TOKENIZER_FILES:
            if os.path.isfile(os.path.join(hf_tok_dir, _HF_COPY + name)):
                shutil.copyfile(os.path.join(hf_tok_dir, _HF_COPY + name),
                                os.path.join(model_dir, name))
        return
    shutil.copyfile(os.path.join(dict_dir, "dict.txt"), os.path.join(model_dir, "dict.txt"))
    if spm_path is not None and os.path.isfile(spm_path):
        shutil.copyfile(spm_path, os.path.join(model_dir, "spm.model"))
    if fast is not None:
        # tokenizer.json in fairseq ids (the rows' order): AutoTokenizer needs no mapping
        size = fast.get_vocab_size(with_added_tokens=True)
        names = [fast.id_to_token(i) for i in (0, 1, 2, 3, size - 1)]
        _transformers().PreTrainedTokenizerFast(
            tokenizer_object=fast, model_max_length=config.max_position_embeddings,
            **dict(zip(_SPECIAL_ROLES, names)), cls_token=names[0], sep_token=names[2],
            model_input_names=["input_ids", "token_type_ids", "attention_mask"],  # as BERT's
        ).save_pretrained(model_dir)
        return
    with open(os.path.join(model_dir, "VOCABULARY.md"), "w", encoding="utf-8") as f:
        f.write(
            "# Vocabulary of this model\n\n"
            "Exported from a fairseq ELECTRA checkpoint whose data directory has no tokenizer\n"
            "description (electra_tokenizer.json), so no Hugging Face tokenizer is included.\n"
            "Embedding rows follow the fairseq dictionary: id 0 <s>, 1 <pad>, 2 </s>, 3 <unk>,\n"
            "then the entries of dict.txt in order, then <mask> (the last id). Encode text with\n"
            "the tokenizer the data was prepared with, or look pieces up in dict.txt, and start\n"
            "each sequence with <s> (0).\n")


def to_hf(checkpoint, out_dir, overwrite: bool = False, *, data: Optional[str] = None,
          vocab: Optional[str] = None, head: Optional[str] = None) -> ExportResult:
    """An ELECTRA checkpoint -> Hugging Face directory(ies) under ``out_dir``.

    ``out_dir`` gets the discriminator: ``ElectraForSequenceClassification`` (or, for a
    ``token_tagging`` checkpoint, ``ElectraForTokenClassification``) when the
    checkpoint has a classification head (``head`` picks one when it has several),
    otherwise ``ElectraForPreTraining`` with the replaced-token head or ``ElectraModel``
    without it. A generator goes to ``out_dir/generator`` as ``ElectraForMaskedLM``.
    Each directory gets config.json, model.safetensors and the vocabulary (see the module
    docstring for dictionaries that did not come from WordPiece).

    Args:
        checkpoint: a checkpoint of this plugin (``fairseq-train`` output or ``from_hf``).
        out_dir: an empty or new directory, unless ``overwrite``.
        data: directory of the dict.txt the model was trained with (default: the
            checkpoint's ``task.data``).
        vocab: the WordPiece vocab.txt that dict.txt was made from, when it is not next to
            dict.txt.
        head: name of the classification head to export.
    """
    checkpoint, out_dir = os.fspath(checkpoint), os.fspath(out_dir)
    state = load_checkpoint(checkpoint)
    cfg = complete_config(OmegaConf.create(OmegaConf.to_container(state["cfg"].model)))
    weights = dict(state["model"])
    for key in BOOKKEEPING_KEYS:  # the FLOPs count and the checkpoint format
        weights.pop(key, None)
    fold_embedding_delta(weights)  # GDES: HF's discriminator holds one token embedding table
    # heads of the ablation objectives and generators have no transformers class
    ablation = [k for k in weights if k.startswith(("mlm_head.", "generator_baseline.",
                                                    "second_stage"))]
    if ablation:
        logger.warning(f"not exported (no transformers class holds them): "
                       f"{sorted({k.split('.')[0] for k in ablation})}")
        for key in ablation:
            del weights[key]
    by_component: Dict[str, Dict[str, torch.Tensor]] = {}
    for key, value in weights.items():
        by_component.setdefault(component_of(key), {})[key] = value
    head_keys = by_component.get("classification_head", {})
    heads = sorted({k.split(".")[1] for k in head_keys})
    # Sentence classification heads (dense + out_proj) and the token heads of a token_tagging
    # checkpoint have HF classes; span (SQuAD) heads registered in the same ModuleDict do
    # not map onto one here and are left out.
    tagging = state["cfg"].get("task", {}).get("_name", None) == "token_tagging"
    sentence_heads = [h for h in heads if f"classification_heads.{h}.dense.weight" in head_keys]
    exportable = [h for h in heads if h not in sentence_heads] if tagging else sentence_heads
    if head is not None and head not in heads:
        raise ElectraUsageError(f"{checkpoint} has no classification head '{head}' (it has "
                                f"{', '.join(heads) or 'none'})")
    if head is not None and head not in exportable:
        raise ElectraUsageError(f"head '{head}' of {checkpoint} is neither a sentence "
                                f"classification head (dense + out_proj) nor a token_tagging "
                                f"head; only those export (as ElectraForSequenceClassification, "
                                f"ElectraForTokenClassification)")
    if head is None and len(exportable) > 1:
        raise ElectraUsageError(f"{checkpoint} has classification heads "
                                f"{', '.join(exportable)}; pick one to export")
    head = head if head is not None else (exportable[0] if exportable else None)
    if head is not None and not tagging and cfg.get("classifier_pooling", "first") != "first":
        raise ElectraUsageError(f"{checkpoint}'s classification head reads the mean of the "
                                f"tokens (--classifier-pooling mean), HF's the first token; "
                                f"export the discriminator alone (a checkpoint without the "
                                f"head, electra-extract)")

    dictionary, dict_dir = _find_dictionary(state["cfg"], data)
    tok_dir = _tokenizer_dir(dict_dir)
    vocab_path, tokenizer_settings, meta = _find_vocab(tok_dir, vocab)
    index = None
    if vocab_path is not None:
        tokens = load_vocab(vocab_path)
        index = torch.tensor(vocab_to_fairseq_indices(tokens))
        _check_dictionary(dictionary, tokens, index, os.path.join(dict_dir, "dict.txt"))
        pad_token_id = tokens.index("[PAD]")
    else:  # rows stay in fairseq order; a sentencepiece tokenizer.json uses the same ids
        pad_token_id = dictionary.pad()
    fast = spm_path = hf_tok_dir = None
    hf_order = _hf_order(tok_dir, dictionary) if vocab_path is None else None
    if hf_order is not None:  # imported from HF: its ids and its tokenizer back
        index, hf_tok_dir = hf_order, tok_dir
        pad_token_id = index.tolist().index(dictionary.pad())
    elif vocab_path is None and meta.get("type") in ("sentencepiece", "tokenizers"):
        # pairs as the model reads them: type 1 after the first </s> with segment types
        pair_type = int(bool(cfg.get("segment_token_types")) and cfg.type_vocab_size > 1)
        fast = tokenizer_from_metadata(tok_dir, meta).fast(pair_type)
        if meta["type"] == "sentencepiece":
            spm_path = os.path.join(tok_dir, meta.get("model", "spm.model"))
    elif vocab_path is None:
        logger.warning(f"{dict_dir} has no tokenizer description ({METADATA_FILE}): rows stay "
                       f"in fairseq order and no HF tokenizer is written (see VOCABULARY.md)")
    rows = weights["discriminator.embeddings.word_embeddings.weight"].size(0)
    if rows != len(dictionary):
        raise ElectraUsageError(f"{checkpoint} has {rows} embedding rows but {dict_dir}/dict.txt "
                                f"gives {len(dictionary)} (with <mask>); pass the dictionary the "
                                f"model was trained with (--data)")

    fields = {ours: cfg[ours] for ours, _ in CONFIG_TABLE}
    if fields["type_vocab_size"] == 0:  # HF always adds a token type row: make it zero
        fields["type_vocab_size"] = 1
        for prefix in ("discriminator", "generator"):
            if f"{prefix}.embeddings.word_embeddings.weight" in weights:
                by_component[prefix][f"{prefix}.embeddings.token_type_embeddings.weight"] = \
                    torch.zeros(1, fields["embedding_size"])
    dtype = weights["discriminator.embeddings.word_embeddings.weight"].dtype

    if head is not None:
        architecture = ("ElectraForTokenClassification" if tagging
                        else "ElectraForSequenceClassification")
        dropped = [c for c in ("discriminator_head",) if c in by_component]
    elif "discriminator_head" in by_component:
        architecture, dropped = "ElectraForPreTraining", []
    else:
        architecture, dropped = "ElectraModel", []
    for name in heads:
        if name != head:
            dropped.append(f"classification head '{name}'")
    if dropped:
        logger.info(f"not exported: {', '.join(dropped)}")
    components = HF_ARCHITECTURES[architecture]
    num_classes, labels = 0, None
    disc_state = {}
    for component in components:
        part = by_component.get(component, {})
        if component in ("classification_head", "token_head"):
            part = {k: v for k, v in by_component["classification_head"].items()
                    if k.startswith(f"classification_heads.{head}.")}
            num_classes = part[f"classification_heads.{head}.out_proj.weight"].size(0)
            labels = _label_names(dict_dir, num_classes)
        disc_state.update(part)
    sizes = {c: symbols(fields, len(dictionary), num_classes) for c in components}
    params = expand(components, sizes, head)
    hf_state = rename(disc_state, params, to_hf=True, where=checkpoint)
    permute_rows(hf_state, params, to_hf=True, fairseq_index=index)
    if architecture == "ElectraModel":
        hf_state = {k[len("electra."):]: v for k, v in hf_state.items()}

    gen_dir = os.path.join(out_dir, "generator") if "generator" in by_component else None
    _prepare_out_dir(out_dir, overwrite, _EXPORT_FILES)
    old_gen_dir = os.path.join(out_dir, "generator")
    if os.path.isdir(old_gen_dir):  # overwrite: no stale generator next to the new export
        _prepare_out_dir(old_gen_dir, overwrite, _EXPORT_FILES)
        if gen_dir is None and not os.listdir(old_gen_dir):
            os.rmdir(old_gen_dir)
    with removed_on_failure(out_dir):  # a failed export leaves no directory that looks whole
        _write_model_dir(out_dir, hf_state,
                         _hf_config(fields, architecture, len(dictionary), pad_token_id, dtype,
                                    labels),
                         vocab_path, tokenizer_settings, dict_dir, spm_path, fast, hf_tok_dir)
        if gen_dir is not None:
            gen_fields = _encoder_fields(fields, GENERATORS[cfg.generator](cfg).size())
            components = HF_ARCHITECTURES["ElectraForMaskedLM"]
            sizes = {c: symbols(gen_fields, len(dictionary)) for c in components}
            params = expand(components, sizes)
            gen_state = {**by_component["generator"], **by_component.get("generator_head", {})}
            gen_hf = rename(gen_state, params, to_hf=True, where=checkpoint)
            permute_rows(gen_hf, params, to_hf=True, fairseq_index=index)
            _write_model_dir(gen_dir, gen_hf,
                             _hf_config(gen_fields, "ElectraForMaskedLM", len(dictionary),
                                        pad_token_id, dtype),
                             vocab_path, tokenizer_settings, dict_dir, spm_path, fast,
                             hf_tok_dir)
    logger.info(f"exported {checkpoint} -> {out_dir} ({architecture})"
                f"{' + generator/ (ElectraForMaskedLM)' if gen_dir else ''}")
    return ExportResult(out_dir, architecture, gen_dir, vocab_path is not None,
                        vocab_path is not None or fast is not None or hf_tok_dir is not None)


def _label_names(dict_dir: str, num_classes: int) -> List[str]:
    """Class names from a sentence_prediction label/dict.txt next to input0/, or a tagging
    data directory's labels.txt, else LABEL_i."""
    tags = os.path.join(dict_dir, LABELS_FILE)
    if os.path.isfile(tags):
        with open(tags, encoding="utf-8") as f:
            names = f.read().split()
        if len(names) == num_classes:
            return names
    path = os.path.join(os.path.dirname(dict_dir.rstrip(os.sep)), "label", "dict.txt")
    if os.path.basename(dict_dir.rstrip(os.sep)) == "input0" and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            names = [line.split()[0] for line in f if line.strip()]
        if len(names) == num_classes:
            return names
    return [f"LABEL_{i}" for i in range(num_classes)]
