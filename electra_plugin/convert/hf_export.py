"""Export: a plugin checkpoint -> an HF ELECTRA directory transformers loads, with its
tokenizer (``electra-convert export``)."""

import logging
import os
import shutil
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from omegaconf import OmegaConf

from ..data.conll import LABELS_FILE
from ..data.tokenizer import (METADATA_FILE, tokenizer_from_metadata)
from ..data.wordpiece import load_vocab, vocab_to_fairseq_indices
from ..finetuning.kinds import kind_of_fairseq_task
from ..models.bodies import body_of
from ..models.core.checkpoint import import_user_dir, load_checkpoint, task_name
from ..models.core.config import complete_config
from ..models.generators import GENERATOR_KINDS
from ..models.loading import BOOKKEEPING_KEYS, fold_embedding_delta
from ..user_io.errors import ElectraUsageError
from ..user_io.partial_output import removed_on_failure
from .families import BERT, family_of_body
from .hf_files import (EXPORT_FILES, HF_COPY, HF_ORDER, HF_TOKENIZER_FILES, SPECIAL_ROLES,
                       check_dictionary, encoder_fields, hf_config, prepare_out_dir, read_json,
                       transformers_module)
from .keys import (COMPONENT_PREFIXES, HeadKind, component_of, expand, head_keys,
                   head_kind, head_kinds, permute_rows, rename, symbols)

logger = logging.getLogger(__name__)


def _hf_order(tok_dir: str, dictionary) -> Optional[torch.Tensor]:
    """HF id -> fairseq row of a dictionary imported from a non-WordPiece checkpoint, or None."""
    path = os.path.join(tok_dir, HF_ORDER)
    if not os.path.isfile(path):
        return None
    rows = read_json(path).get("fairseq_row_of_hf_id")
    if not isinstance(rows, list) or sorted(rows) != list(range(len(dictionary))):
        raise ElectraUsageError(f"{path} does not order the {len(dictionary)} rows of "
                                f"{tok_dir}/dict.txt; remove it to export in fairseq's order")
    return torch.tensor(rows)


@dataclass
class ExportResult:
    discriminator_dir: str
    architecture: str
    generator_dir: Optional[str]
    generator_architecture: Optional[str]  # the generator's class (its body's MaskedLM)
    wordpiece_vocab: bool  # False: rows in fairseq dictionary order, no vocab.txt
    hf_tokenizer: bool  # False: no tokenizer files (see VOCABULARY.md)


def _find_dictionary(cfg, data: Optional[str]):
    """(dictionary with <mask>, the directory of its dict.txt)."""
    from ..data.dictionary import load_dictionary

    if data is None:
        data = getattr(cfg.task, "data", None)
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
        meta = read_json(meta_path)
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
        transformers_module().BertTokenizerFast(
            os.fspath(vocab_path), model_max_length=config.max_position_embeddings,
            **tokenizer_settings,
        ).save_pretrained(model_dir)
        # vocab.txt as well: every row, repeated entries included (tokenizer.json holds a map)
        shutil.copyfile(vocab_path, os.path.join(model_dir, "vocab.txt"))
        return
    if hf_tok_dir is not None:  # the imported checkpoint's own tokenizer files, as they were
        for name in HF_TOKENIZER_FILES:
            if os.path.isfile(os.path.join(hf_tok_dir, HF_COPY + name)):
                shutil.copyfile(os.path.join(hf_tok_dir, HF_COPY + name),
                                os.path.join(model_dir, name))
        return
    shutil.copyfile(os.path.join(dict_dir, "dict.txt"), os.path.join(model_dir, "dict.txt"))
    if spm_path is not None and os.path.isfile(spm_path):
        shutil.copyfile(spm_path, os.path.join(model_dir, "spm.model"))
    if fast is not None:
        # tokenizer.json in fairseq ids (the rows' order): AutoTokenizer needs no mapping
        size = fast.get_vocab_size(with_added_tokens=True)
        names = [fast.id_to_token(i) for i in (0, 1, 2, 3, size - 1)]
        transformers_module().PreTrainedTokenizerFast(
            tokenizer_object=fast, model_max_length=config.max_position_embeddings,
            **dict(zip(SPECIAL_ROLES, names)), cls_token=names[0], sep_token=names[2],
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

    ``out_dir`` gets the discriminator with the checkpoint's fine-tuned head in the HF class
    of its task (``keys.head_kinds()``: sentence_prediction -> ElectraForSequenceClassification,
    token_tagging -> ElectraForTokenClassification, squad 1.1 -> ElectraForQuestionAnswering,
    sentence_ranking -> ElectraForMultipleChoice; ``head`` picks one when it has several),
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
    import_user_dir(state["cfg"])  # a kind of one's own says whether transformers serves it
    cfg = complete_config(OmegaConf.create(OmegaConf.to_container(state["cfg"].model)))
    family = family_of_body(body_of(cfg).name, checkpoint)
    weights = dict(state["model"])
    for key in BOOKKEEPING_KEYS:  # the FLOPs count and the checkpoint format
        weights.pop(key, None)
    fold_embedding_delta(weights)  # GDES: HF's discriminator holds one token embedding table
    # what no transformers class holds (the heads and state of the ablation variants)
    ablation = [k for k in weights if not k.startswith(tuple(COMPONENT_PREFIXES.values()))]
    if ablation:
        logger.warning(f"not exported (no transformers class holds them): "
                       f"{sorted({k.split('.')[0] for k in ablation})}")
        for key in ablation:
            del weights[key]
    by_component: Dict[str, Dict[str, torch.Tensor]] = {}
    for key, value in weights.items():
        by_component.setdefault(component_of(key), {})[key] = value
    fields = {ours: cfg[ours] for ours, _ in BERT.config_table + family.config_table}
    gen_fields = encoder_fields(fields, GENERATOR_KINDS[cfg.generator](cfg).size()) \
        if "generator" in by_component else None
    for encoder in (fields, gen_fields):
        if not family.projects_embeddings and encoder and \
                encoder["hidden_size"] != fields["embedding_size"]:
            raise ElectraUsageError(
                f"{checkpoint}: an encoder {encoder['hidden_size']} wide reads "
                f"{fields['embedding_size']}-dim embeddings through a projection, which "
                f"{family.prefix}'s classes have no slot for; pre-train with --embedding-size "
                f"equal to the hidden size and a generator as wide (the electra_{family.body}_* "
                f"archs), or keep the fairseq checkpoint")
    if "generator" in by_component and cfg.get("enhanced_mask_decoder", False):
        logger.info("not exported: the generator (no transformers class runs DeBERTa's enhanced "
                    "mask decoder: it stays in the fairseq checkpoint)")
        for component in ("generator", "generator_head"):
            by_component.pop(component, None)
        gen_fields = None
    trained_for = task_name(state["cfg"].get("task", None))
    finetuned = kind_of_fairseq_task(trained_for)
    if finetuned is not None and finetuned.hf_head is None and \
            by_component.get("classification_head"):
        raise ElectraUsageError(
            f"{checkpoint}'s head ({finetuned.title}, --task {trained_for}) has no "
            f"transformers class; export the discriminator alone (electra-extract), or keep "
            f"the fairseq checkpoint")
    # another task's heads (an import's, a pre-training's none) are read as sentence heads
    kind = head_kind(task=trained_for) or head_kinds()[0]
    head = _pick_head(checkpoint, by_component.get("classification_head", {}), kind, head,
                      family.rows)
    heads = sorted({k.split(".")[1] for k in by_component.get("classification_head", {})})
    if head is not None and kind.component in ("classification_head", "choice_head") and \
            cfg.get("classifier_pooling", "first") != "first" and not family.pools_mean:
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
        check_dictionary(dictionary, tokens, index, os.path.join(dict_dir, "dict.txt"))
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

    if fields["type_vocab_size"] == 0 and family.always_token_types:
        # ELECTRA's HF embeddings always add a token type row: make it zero
        fields["type_vocab_size"] = 1
        for prefix in ("discriminator", "generator"):
            if f"{prefix}.embeddings.word_embeddings.weight" in weights:
                by_component[prefix][f"{prefix}.embeddings.token_type_embeddings.weight"] = \
                    torch.zeros(1, fields["embedding_size"])
    dtype = weights["discriminator.embeddings.word_embeddings.weight"].dtype

    if head is not None:
        architecture = family.head_architecture(kind)
        if architecture not in family.architectures:
            raise ElectraUsageError(
                f"{checkpoint}'s {kind.task} head has no {family.prefix} class: ModernBERT's "
                f"heads put a dense layer and a norm before the classifier, the plugin's do "
                f"not; export the discriminator alone (electra-extract), or keep the fairseq "
                f"checkpoint")
        dropped = [c for c in ("discriminator_head",) if c in by_component]
    elif "discriminator_head" in by_component and \
            family.pretraining_class != family.prefix + "Model":
        architecture, dropped = family.pretraining_class, []
    else:
        architecture = family.prefix + "Model"
        dropped = ["the replaced-token head (no transformers class of this body holds it: "
                   "it stays in the fairseq checkpoint)"] if "discriminator_head" in \
            by_component else []
    for name in heads:
        if name != head:
            dropped.append(f"classification head '{name}'")
    if dropped:
        logger.info(f"not exported: {', '.join(dropped)}")
    components = family.architectures[architecture]
    num_classes, labels = 0, None
    disc_state = {}
    for component in components:
        part = by_component.get(component, {})
        if component == kind.component:
            part = {k: by_component["classification_head"][k]
                    for k in head_keys(kind, head, family.rows)}
            num_classes = part[f"classification_heads.{head}.out_proj.weight"].size(0)
            if component in ("classification_head", "token_head"):
                labels = _label_names(dict_dir, num_classes)
        disc_state.update(part)
    sizes = {c: symbols(fields, len(dictionary), num_classes) for c in components}
    params = expand(components, sizes, head, family.rows)
    hf_state = rename(disc_state, params, to_hf=True, where=checkpoint)
    permute_rows(hf_state, params, to_hf=True, fairseq_index=index)
    if architecture == family.prefix + "Model":  # the base class: no prefix
        hf_state = {k[len(family.base):]: v for k, v in hf_state.items()}
    ids = _special_ids(dictionary, index) if family.names_special_ids else {}

    gen_dir = os.path.join(out_dir, "generator") if "generator" in by_component else None
    prepare_out_dir(out_dir, overwrite, EXPORT_FILES)
    old_gen_dir = os.path.join(out_dir, "generator")
    if os.path.isdir(old_gen_dir):  # overwrite: no stale generator next to the new export
        prepare_out_dir(old_gen_dir, overwrite, EXPORT_FILES)
        if gen_dir is None and not os.listdir(old_gen_dir):
            os.rmdir(old_gen_dir)
    with removed_on_failure(out_dir):  # a failed export leaves no directory that looks whole
        _write_model_dir(out_dir, hf_state,
                         hf_config(fields, architecture, len(dictionary), pad_token_id, dtype,
                                   labels, family, **ids,
                                   **family.head_config(architecture, cfg)),
                         vocab_path, tokenizer_settings, dict_dir, spm_path, fast, hf_tok_dir)
        if gen_dir is not None:
            gen_class = family.prefix + "ForMaskedLM"
            components = family.architectures[gen_class]
            sizes = {c: symbols(gen_fields, len(dictionary)) for c in components}
            params = expand(components, sizes, rows=family.rows)
            gen_state = {**by_component["generator"], **by_component.get("generator_head", {})}
            gen_hf = rename(gen_state, params, to_hf=True, where=checkpoint)
            permute_rows(gen_hf, params, to_hf=True, fairseq_index=index)
            _write_model_dir(gen_dir, gen_hf,
                             hf_config(gen_fields, gen_class, len(dictionary),
                                       pad_token_id, dtype, family=family, **ids),
                             vocab_path, tokenizer_settings, dict_dir, spm_path, fast,
                             hf_tok_dir)
    logger.info(f"exported {checkpoint} -> {out_dir} ({architecture})"
                f"{f' + generator/ ({family.prefix}ForMaskedLM)' if gen_dir else ''}")
    return ExportResult(out_dir, architecture, gen_dir,
                        family.prefix + "ForMaskedLM" if gen_dir else None,
                        vocab_path is not None,
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


def _pick_head(checkpoint: str, head_weights, kind: HeadKind, head: Optional[str], rows):
    """The head to export (None: the checkpoint has none of ``kind``): ``head``, or the only
    one. A head with parts the HF class has no slot for is refused, naming them."""
    heads = sorted({k.split(".")[1] for k in head_weights})
    if head is not None and head not in heads:
        raise ElectraUsageError(f"{checkpoint} has no classification head '{head}' (it has "
                                f"{', '.join(heads) or 'none'})")
    extra = {h: sorted({k.split(".")[2] for k in head_weights if k.startswith(
        f"classification_heads.{h}.")} - {k.split(".")[2] for k in head_keys(kind, h, rows)})
        for h in heads}
    fitting = [h for h in heads if not extra[h] and
               all(k in head_weights for k in head_keys(kind, h, rows))]
    if head is not None and head not in fitting:
        slots = (f"holds {', '.join(extra[head])}, which {kind.architecture} has no slot for"
                 f"{_NO_SLOT.get(kind.component, '')}" if extra[head] else
                 f"is not a {kind.task} head")
        raise ElectraUsageError(f"head '{head}' of {checkpoint} {slots}; export the "
                                f"discriminator alone with electra-extract, or keep the fairseq "
                                f"checkpoint")
    if head is None and len(fitting) > 1:
        raise ElectraUsageError(f"{checkpoint} has heads {', '.join(fitting)}; pick one to "
                                f"export (--head)")
    if head is None and not fitting and heads:
        return _pick_head(checkpoint, head_weights, kind, heads[0], rows)  # says why it cannot
    return head if head is not None else (fitting[0] if fitting else None)


# why a head's extra parts cannot go: the decisions that have no transformers equivalent
_NO_SLOT = {"span_head": " (SQuAD 2.0's no-answer classifier, or the joint end or "
                         "answerable layers of the official decoding; fine-tune with "
                         "--squad-version 1.1 and the plain span head to serve it through "
                         "transformers)"}


def _special_ids(dictionary, index: Optional[torch.Tensor]) -> dict:
    """The HF ids of the sequence start and separator (ModernBERT's config names them)."""
    rows = index.tolist() if index is not None else list(range(len(dictionary)))
    bos, eos = rows.index(dictionary.bos()), rows.index(dictionary.eos())
    return dict(bos_token_id=bos, cls_token_id=bos, eos_token_id=eos, sep_token_id=eos)
