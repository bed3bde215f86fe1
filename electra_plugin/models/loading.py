"""Fitting a checkpoint's state dict to an ElectraModel: the settings it was trained with,
its optional parts (pre-training parts, heads, bookkeeping), the segment types it read pairs
with, and the shapes and keys it holds; each misfit is one line.

A resume or restore with another ``--arch``, size, objective or generator used to surface as
the first tensor whose shape differed (the token embeddings, then blamed on the dictionary)
or, where the shapes agree (another head count, another objective), not at all.
:func:`check_model_settings` compares the model settings the checkpoint was trained with
(an entry of its weights, from :func:`electra_plugin.models.core.checkpoint.remember_settings`) with this
model's before anything is loaded.
"""

import logging

import torch
from omegaconf import OmegaConf, open_dict

from ..user_io.errors import ElectraUsageError
from .bodies import BODIES, body_named, discriminator_options
from .core.config import (CHECKPOINT_VERSION, arch_generator_layers, arch_generator_size,
                          option_default)
from .core.flops import FlopsCounter

logger = logging.getLogger(__name__)

# What a fine-tuning model keeps of a pre-training checkpoint; everything else (generator,
# pre-training heads, FLOPs counter) exists only for pre-training.
FINETUNING_PARTS = ("discriminator.", "classification_heads.")
# The discriminator's residual on the generator's token embeddings (--embedding-sharing gdes).
GDES_DELTA = "discriminator.embeddings.word_embeddings.delta"
VERSION_KEY = "version"
# state-dict entries that are bookkeeping, not weights: no HF tensor holds them
BOOKKEEPING_KEYS = (FlopsCounter.KEY, VERSION_KEY)

# The settings that decide what a checkpoint's weights mean: sizes decide their shapes;
# the encoder body, heads, objective and generator what tensors of the same shapes compute. The
# discriminator's are compared for any model, the rest when this model pre-trains.
PRETRAINING_SETTINGS = ("objective", "generator", "generator_size", "generator_layers",
                        "embedding_sharing", "two_stage_updates", "enhanced_mask_decoder")


def check_model_settings(model, state_dict, path, saved) -> None:
    """Raise naming every setting in which the checkpoint's model (``saved``: its settings,
    ``path``: its file) differs from ``model``.

    A vocabulary of another size alone is the data's dictionary; the body's
    ``context_settings`` (a longer context: its length limit, its RoPE theta) are the same
    model extended; anything else is another model. Weights that did not come through
    fairseq's loader carry no settings and are left to the shape check of
    ``ElectraModel.load_state_dict``.
    """
    if saved is None:
        return
    here = model.cfg
    names = tuple(dict.fromkeys(  # the body first, then the options of both bodies
        ("encoder_body", *(option for cfg in (saved, here)
                           for option in discriminator_options(cfg)
                           if option not in PRETRAINING_SETTINGS)))) + (
        PRETRAINING_SETTINGS if model.pretraining else ())
    differ = [n for n in names if _effective(saved, n) != _effective(here, n)]
    if _effective(saved, "encoder_body") == _effective(here, "encoder_body"):
        extended = [n for n in differ
                    if n in body_named(_effective(here, "encoder_body")).context_settings]
        if extended:
            logger.info("context extension of %s: %s", path, ", ".join(
                f"--{n.replace('_', '-')} {_setting(_effective(saved, n))} -> "
                f"{_setting(_effective(here, n))}" for n in extended))
            differ = [n for n in differ if n not in extended]
    own = model.state_dict()
    vocab, vocab_here = next(((state_dict[k].shape[0], own[k].shape[0]) for k in own
                              if k.endswith("word_embeddings.weight") and k in state_dict),
                             (None, None))
    if not differ:
        if vocab != vocab_here:
            raise vocabulary_error(vocab, vocab_here)
        return
    arch, arch_here = (c.get("arch", None) or c.get("_name", None) for c in (saved, here))
    if arch != arch_here:
        differ.insert(0, "arch")

    def options(cfg, arch_name):
        return ", ".join(f"--{n.replace('_', '-')} "
                         f"{arch_name if n == 'arch' else _setting(_effective(cfg, n))}"
                         for n in differ)

    vocabulary = (f"; its vocabulary has {vocab} entries and this data's dictionary "
                  f"{vocab_here}" if vocab != vocab_here else "")
    raise ElectraUsageError(
        f"checkpoint {path} does not fit this model: it was trained with "
        f"{options(saved, arch)} where this command gives {options(here, arch_here)}"
        f"{vocabulary}; run with the checkpoint's --arch and model options (or give a new "
        f"model its own --save-dir)")


def vocabulary_error(entries: int, entries_here: int) -> ElectraUsageError:
    return ElectraUsageError(
        f"the checkpoint's vocabulary has {entries} entries but this data's dictionary gives "
        f"{entries_here}: the data was binarized with another dict.txt; binarize it with the "
        f"pre-training dict.txt")


def _effective(cfg, name):
    """A setting as the model uses it: an unset generator size is the arch's."""
    value = cfg.get(name, None)
    if name == "generator_size" and value is None:
        return arch_generator_size(cfg)
    if name == "generator_layers" and value is None:
        return arch_generator_layers(cfg)
    if name == "encoder_body" and value is None:
        return "bert"  # a checkpoint from before --encoder-body
    if value is None and any(name in body.options for body in BODIES.values()):
        # a checkpoint from before that body option (a --user-dir body's too)
        return option_default(name)
    return value


def _setting(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def fit_parts(model, state_dict, prefix="") -> None:
    """In place: a checkpoint's optional parts fitted to ``model``.

    Pre-training parts (generator, replaced-token head, FLOPs counter) are dropped when the
    model was built for fine-tuning, after folding a GDES residual into the discriminator's
    token embeddings; a pre-training checkpoint without a FLOPs counter (older, or converted
    from HF) starts the count at 0; one without a version key is version 1. Classification
    heads the checkpoint has and the model lacks are registered with
    ``--load-checkpoint-heads`` and dropped otherwise; a head of the same name with another
    number of classes is an error (``--classification-head-name`` picks a new head).
    """
    if not model.pretraining:
        fold_embedding_delta(state_dict, prefix)
        keep = tuple(prefix + p for p in FINETUNING_PARTS)
        for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(keep)]:
            del state_dict[key]
    else:
        state_dict.setdefault(prefix + FlopsCounter.KEY, torch.zeros((), dtype=torch.float64))
        version = int(state_dict.get(prefix + VERSION_KEY, 1))  # 1: saved before the key
        if version > CHECKPOINT_VERSION:
            raise ElectraUsageError(
                f"the checkpoint was written by a newer version of the plugin (format "
                f"{version}, this one reads up to {CHECKPOINT_VERSION}); upgrade the plugin")
        # version 1 holds the same tensors; its options were renamed (config.py upgrades)
        state_dict[prefix + VERSION_KEY] = torch.tensor(CHECKPOINT_VERSION)
    heads_prefix = prefix + "classification_heads."
    heads = model.classification_heads
    for head, num_classes in _heads_in(state_dict, heads_prefix).items():
        if head not in heads:
            if model.cfg.get("load_checkpoint_heads", False):
                model.register_classification_head(head, num_classes)
            else:
                logger.info(f"dropping classification head '{head}' of the checkpoint")
                for key in [k for k in state_dict if k.startswith(f"{heads_prefix}{head}.")]:
                    del state_dict[key]
        elif heads[head].out_proj.out_features != num_classes:
            raise ElectraUsageError(
                f"the checkpoint's classification head '{head}' has {num_classes} classes "
                f"but this run asks for {heads[head].out_proj.out_features}; set "
                f"--num-classes {num_classes} or give the new head another "
                f"--classification-head-name")
    for key, value in heads.state_dict().items():
        state_dict.setdefault(heads_prefix + key, value)  # new heads keep their init


def check_fits(model, state_dict, strict: bool) -> None:
    """Raise one line for a tensor of another shape (a dictionary of another size named as
    such) or, when ``strict``, for missing or unexpected keys."""
    own = model.state_dict()
    for key, value in state_dict.items():
        if key in own and own[key].shape != value.shape:
            if key.endswith(("word_embeddings.weight", GDES_DELTA)) and \
                    own[key].shape[0] != value.shape[0]:
                raise vocabulary_error(value.shape[0], own[key].shape[0])
            raise ElectraUsageError(
                f"checkpoint does not fit this model: {key} has shape "
                f"{list(value.shape)} there but {list(own[key].shape)} here; use the --arch "
                f"and size options the checkpoint was trained with")
    if strict:
        missing = sorted(set(own) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(own))
        if missing or unexpected:
            raise ElectraUsageError(
                f"checkpoint does not fit this model: {len(missing)} missing keys "
                f"{missing[:3]} and {len(unexpected)} unexpected keys {unexpected[:3]}; "
                f"is it an ELECTRA checkpoint of the same --arch?")


def adopt_segment_types(model, saved, model_cfg=None) -> None:
    """With --segment-token-types unset, read pairs as the weights' own model did: a
    checkpoint pre-trained on segment pairs (or imported from HF) gives its fine-tuning
    type 1 on the second segment. The choice is written into the run's model config
    (``model_cfg``, which fairseq saves), so the fine-tuned checkpoint keeps it. ``saved``:
    the checkpoint's model settings (None: weights that came without them)."""
    if saved is None or model.cfg.get("segment_token_types", None) is not None:
        return
    adopted = bool(saved.get("segment_token_types", None))
    for cfg in (model.cfg, model_cfg):
        if cfg is not None and OmegaConf.is_config(cfg):
            with open_dict(cfg):
                cfg.segment_token_types = adopted
    if adopted:
        logger.info("pairs read with token type 1 on the second segment, as the "
                    "checkpoint was trained (--segment-token-types)")


def fold_embedding_delta(state_dict, prefix="") -> None:
    """In place: a GDES discriminator's token embeddings as one table, E_generator + delta.

    What a plain ELECTRA discriminator holds (fine-tuning, the HF export, the extracted
    discriminator); a state dict without the residual is left as it is.
    """
    delta = state_dict.pop(prefix + GDES_DELTA, None)
    if delta is not None:
        shared = state_dict[prefix + "generator.embeddings.word_embeddings.weight"]
        state_dict[prefix + "discriminator.embeddings.word_embeddings.weight"] = shared + delta


def _heads_in(state_dict, heads_prefix):
    """{head name: number of classes} of the classification heads in a state dict."""
    return {key[len(heads_prefix):].split(".")[0]: value.size(0)
            for key, value in state_dict.items()
            if key.startswith(heads_prefix) and key.endswith(".out_proj.weight")}
