"""The Hugging Face side of a conversion: reading and writing the files of an HF model
directory (config.json through transformers, weights, tokenizer settings).

The decisions both directions share are in :mod:`electra_plugin.convert`.
"""

import json
import logging
import os
from typing import Dict, Optional, Sequence

import torch
from tokenizers import Tokenizer
from tokenizers.normalizers import BertNormalizer

from ..environment.optional import require
from ..models.core.checkpoint_file import refused_pickle_error
from ..models.core.config import EncoderSize
from ..user_io.errors import ElectraUsageError, first_line
from ..user_io.output_dir import refuse_existing
from ..user_io.partial_output import unusable_destination

logger = logging.getLogger(__name__)

# An imported non-WordPiece checkpoint keeps HF's id order for its export (the dictionary
# is in fairseq's): HF id -> fairseq row, and the HF tokenizer files, stored with this prefix.
HF_ORDER = "hf_order.json"
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
HF_COPY = "hf_"
# transformers' names of the roles of ids 0-3 and of <mask> (the last id)
SPECIAL_ROLES = ("bos_token", "pad_token", "eos_token", "unk_token", "mask_token")
# Non-persistent buffers that transformers 4.x wrote into some checkpoints: not parameters.
HF_BUFFERS = ("electra.embeddings.position_ids", "electra.embeddings.token_type_ids")
SHARED_ENCODER_FIELDS = ("embedding_size", "max_positions", "type_vocab_size")


def read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise ElectraUsageError(f"cannot read {path}: {e}")
    if not isinstance(value, dict):
        raise ElectraUsageError(f"{path} is not a JSON object")
    return value


def read_hf_config(model_dir: str):
    """(config.json of an HF directory with defaults filled and unsupported settings
    rejected, the model family of the body that computes it)."""
    from .families import family_of_model_type

    if not os.path.isdir(model_dir):
        raise ElectraUsageError(f"{model_dir} is not a directory (expected a Hugging Face model "
                                f"directory written by save_pretrained)")
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise ElectraUsageError(f"{model_dir} has no config.json; is it a Hugging Face model "
                                f"directory (written by save_pretrained)?")
    config = read_json(path)
    family = family_of_model_type(config.get("model_type"), path)
    try:  # transformers fills in its defaults (and id2label from num_labels)
        config = family.config_class().from_dict(config).to_dict()
    except (TypeError, ValueError) as e:
        raise ElectraUsageError(f"{path}: {first_line(e)}")
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise ElectraUsageError(f"{path}: decoder models (is_decoder / add_cross_attention) "
                                f"are not supported")
    return family.check_config(config, path), family


def transformers_module():
    """transformers, which fills in, writes and reads the HF config and tokenizer files."""
    return require("converting to or from Hugging Face transformers")


def hf_config(fields: dict, architecture: str, vocab_size: int, pad_token_id: int,
              dtype: torch.dtype, labels: Optional[Sequence[str]] = None, family=None,
              **extra):
    """The transformers config of one encoder of ``family`` (default ELECTRA's; ``extra``:
    its head's fields)."""
    from .families import BERT

    family = family or BERT
    if labels is not None:
        extra = {**extra, "id2label": dict(enumerate(labels)),
                 "label2id": {label: i for i, label in enumerate(labels)}}
    return family.config_class()(
        architectures=[architecture], vocab_size=vocab_size, pad_token_id=pad_token_id,
        dtype=dtype, **family.hf_config_values(fields), **extra)


def encoder_fields(fields: dict, size: EncoderSize) -> dict:
    """The per-encoder fields of an encoder of ``size``, the others as ``fields``."""
    return dict(fields, num_layers=size.layers, hidden_size=size.hidden, num_heads=size.heads,
                ffn_size=size.ffn)


# ------------------------------------------------------------------------- HF directories
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


# Files an export writes (and, with overwrite, replaces) in each model directory.
EXPORT_FILES = WEIGHT_FILES + ("config.json", "vocab.txt", "tokenizer_config.json",
                                 "special_tokens_map.json", "tokenizer.json", "dict.txt",
                                 "spm.model", "VOCABULARY.md")


def load_weight_file(path: str) -> Dict[str, torch.Tensor]:
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
    for name in WEIGHT_FILES:
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            break
    else:
        raise ElectraUsageError(f"{model_dir} has no weights (model.safetensors or "
                                f"pytorch_model.bin)")
    if not name.endswith(".index.json"):
        return load_weight_file(path)
    weight_map = read_json(path).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ElectraUsageError(f"{path} has no weight_map")
    state = {}
    for shard in sorted(set(weight_map.values())):
        state.update(load_weight_file(os.path.join(model_dir, shard)))
    return state


def hf_fast_tokenizer(model_dir: str) -> Optional[Tokenizer]:
    """The ``tokenizers`` tokenizer saved as tokenizer.json in an HF directory, or None."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a plain Exception for a malformed file
        raise ElectraUsageError(f"cannot read {path}: {first_line(e)}")


def prepare_out_dir(out_dir: str, overwrite: bool, managed: Sequence[str]) -> None:
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


def read_tokenizer_settings(model_dir: str) -> dict:
    """do_lower_case etc. from an HF tokenizer_config.json (BERT's defaults otherwise)."""
    settings = {"do_lower_case": True, "strip_accents": None, "tokenize_chinese_chars": True}
    tokenizer = hf_fast_tokenizer(model_dir)
    if tokenizer is not None and isinstance(tokenizer.normalizer, BertNormalizer):
        normalizer = tokenizer.normalizer
        settings.update(do_lower_case=normalizer.lowercase,
                        strip_accents=normalizer.strip_accents,
                        tokenize_chinese_chars=normalizer.handle_chinese_chars)
    path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.isfile(path):
        config = read_json(path)
        settings.update({k: config[k] for k in settings if k in config})
    return settings


def check_dictionary(dictionary, tokens: Sequence[str], index: torch.Tensor, where: str):
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


def pair_token_type(model_dir: str) -> Optional[int]:
    """The token type an HF tokenizer gives the second segment of a pair (from its
    tokenizer.json's post-processor): 1 as BERT's, 0 where the model reads pairs without
    segments (the plugin's export of a model pre-trained that way); None when it says not."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    processor = read_json(path).get("post_processor") or {}
    if processor.get("type") == "BertProcessing":
        return 1
    if processor.get("type") == "RobertaProcessing":
        return 0
    types = [item["Sequence"].get("type_id") for item in processor.get("pair") or []
             if isinstance(item, dict) and item.get("Sequence", {}).get("id") == "B"]
    return types[0] if processor.get("type") == "TemplateProcessing" and types else None

