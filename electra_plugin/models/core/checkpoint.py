"""Write and read fairseq checkpoint files outside ``fairseq-train``.

:func:`write_checkpoint` makes a file that fairseq treats like one its trainer saved at
update 0, so it can start a run three ways::

    fairseq-train DATA --restore-file X --reset-optimizer --reset-dataloader --reset-meters ...
    fairseq-train DATA --finetune-from-model X ...
    fairseq.checkpoint_utils.load_model_ensemble_and_task([X], arg_overrides={"data": DATA})

The configuration stored in it is a full :class:`fairseq.dataclass.configs.FairseqConfig`
(every group: common, dataset, optimization, checkpoint, ...) with the model, task and
(optionally) criterion groups filled from their registered dataclasses, resolved to plain
containers exactly as ``Trainer.state_dict`` stores it. There is no optimizer state, so the
trainer builds a fresh optimizer even without ``--reset-optimizer``.

:func:`load_checkpoint` reads such a file (or one ``fairseq-train`` wrote) and reports a
missing file, a file that is not a PyTorch checkpoint, or a checkpoint of another model with
one :class:`~electra_plugin.user_io.errors.ElectraUsageError` line.
"""

import argparse
import logging
import os
import sys
from dataclasses import is_dataclass
from typing import Any, Dict, Mapping, MutableMapping, Optional, Tuple

import torch
from fairseq.criterions import CRITERION_DATACLASS_REGISTRY, CRITERION_REGISTRY
from fairseq.dataclass.configs import FairseqConfig
from fairseq.dataclass.utils import overwrite_args_by_name
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY, MODEL_REGISTRY
from fairseq.tasks import TASK_DATACLASS_REGISTRY
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from ...user_io.errors import ElectraUsageError, first_line
from ...user_io.partial_output import written_whole
from .checkpoint_file import read_checkpoint_file
from .config import complete_config

logger = logging.getLogger(__name__)

__all__ = ["build_fairseq_config", "write_checkpoint", "load_checkpoint", "is_electra_model_cfg",
           "remember_settings", "take_settings", "SETTINGS_KEY"]

# fairseq's argparse tasks (sentence_ranking ...) save their settings as a Namespace, a plain
# attribute container: without it torch's weights-only loader refuses their checkpoints,
# resuming such a run included
torch.serialization.add_safe_globals([argparse.Namespace])


def _as_dict(cfg) -> Dict[str, Any]:
    """A model/task/criterion config given as dict, DictConfig, Namespace or dataclass."""
    if cfg is None:
        return {}
    if OmegaConf.is_config(cfg):
        return OmegaConf.to_container(cfg, resolve=False)
    if is_dataclass(cfg):
        return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=False)
    if isinstance(cfg, Mapping):
        return dict(cfg)
    return dict(vars(cfg))


def _group(kind: str, cfg, registry: Mapping[str, Any], resolve_name=lambda n: n) -> DictConfig:
    """One config group: the registered dataclass's defaults updated with ``cfg``.

    ``cfg`` must carry ``_name`` (the registered name, e.g. ``electra`` or ``masked_lm``).
    Unknown names and unknown fields are errors, not silently dropped keys.
    """
    values = _as_dict(cfg)
    name = values.get("_name")
    if not name:
        raise ElectraUsageError(f"the {kind} config has no _name (e.g. _name='electra')")
    dataclass = registry.get(resolve_name(name))
    if dataclass is None:
        raise ElectraUsageError(
            f"unknown {kind} '{name}'; is the plugin imported (--user-dir electra_plugin)?")
    try:
        group = OmegaConf.merge(OmegaConf.structured(dataclass), values)
    except OmegaConfBaseException as e:
        raise ElectraUsageError(f"bad {kind} config for '{name}': {first_line(e)}")
    with open_dict(group):
        group._name = name
    return group


def _model_dataclass_name(name: str) -> str:
    """An architecture name (``electra_small``) -> its model name (``electra``)."""
    if name in MODEL_DATACLASS_REGISTRY:
        return name
    model_cls = ARCH_MODEL_REGISTRY.get(name)
    for model_name, cls in MODEL_REGISTRY.items():
        if cls is model_cls:
            return model_name
    return name


def build_fairseq_config(model_cfg, task_cfg, criterion_cfg=None) -> DictConfig:
    """A complete FairseqConfig with the given model, task and criterion groups.

    Each of ``model_cfg``, ``task_cfg``, ``criterion_cfg`` is a dict (or DictConfig,
    Namespace, dataclass instance) with ``_name`` and the fields to set; every other field
    keeps its registered default. Interpolations such as ``task.seed: ${common.seed}``
    resolve against the returned root config.
    """
    cfg = OmegaConf.structured(FairseqConfig)
    with open_dict(cfg):
        cfg.model = _group("model", model_cfg, MODEL_DATACLASS_REGISTRY, _model_dataclass_name)
        cfg.task = _group("task", task_cfg, TASK_DATACLASS_REGISTRY)
        if criterion_cfg is not None:
            cfg.criterion = _group("criterion", criterion_cfg, CRITERION_DATACLASS_REGISTRY)
    return cfg


def write_checkpoint(path, model_cfg, task_cfg, state_dict: Mapping[str, torch.Tensor], *,
                     criterion_cfg=None, overwrite: bool = False) -> str:
    """Save ``state_dict`` as a fairseq checkpoint at update 0; returns the path.

    Args:
        path: the file to write (its directory is created).
        model_cfg: model config with ``_name`` (``electra`` or an ``electra_*`` arch) and the
            size fields; see :func:`build_fairseq_config`.
        task_cfg: task config with ``_name`` (``electra`` for a pre-training checkpoint with
            generator, any other text task such as ``masked_lm`` for the discriminator alone)
            and ``data``; for one of fairseq's argparse tasks (``sentence_ranking``) an
            ``argparse.Namespace``, stored as fairseq-train stores it.
        state_dict: parameter name -> tensor, as ``model.state_dict()`` gives it (tensors
            shared between names stay shared in the file).
        criterion_cfg: optional criterion config (``{"_name": "electra"}``).
        overwrite: replace an existing file instead of raising.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ElectraUsageError(f"{path} is a directory; give the checkpoint file name")
    if os.path.exists(path) and not overwrite:
        raise ElectraUsageError(f"{path} already exists; remove it or ask to overwrite it")
    argparse_task = isinstance(task_cfg, argparse.Namespace)
    # an argparse task has no dataclass to complete: the other groups are built around a
    # stand-in and the Namespace takes its place in the file
    cfg = build_fairseq_config(model_cfg, {"_name": "masked_lm"} if argparse_task else task_cfg,
                               criterion_cfg)
    criterion_name = ""
    if criterion_cfg is not None:
        criterion_name = CRITERION_REGISTRY[cfg.criterion._name].__name__
    try:
        container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    except OmegaConfBaseException as e:
        raise ElectraUsageError(f"cannot resolve the checkpoint config: {first_line(e)}")
    if argparse_task:
        container["task"] = task_cfg
    state = {
        "args": None,  # legacy argparse slot; fairseq reads "cfg" when this is None
        "cfg": container,
        "model": dict(state_dict),
        "criterion": None,
        # What Trainer.state_dict writes, at update 0 and without optimizer state: the
        # trainer then builds its optimizer from scratch whatever the --reset-* flags say.
        "optimizer_history": [{
            "criterion_name": criterion_name,
            "optimizer_name": "",
            "lr_scheduler_state": {"best": None},
            "num_updates": 0,
        }],
        "task_state": {},
        "extra_state": {
            # epoch 1, nothing consumed yet: also valid without --reset-dataloader
            "train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "shuffle": True,
                               "version": 2},
            "previous_training_time": 0.0,
        },
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with written_whole(path) as partial, open(partial, "wb") as f:
        torch.save(state, f)  # into Python's file: a full disk keeps its errno
    logger.info(f"wrote {path} ({cfg.model._name}, task {task_name(container['task'])})")
    return path


def task_name(task_cfg) -> Optional[str]:
    """The ``_name`` of a checkpoint's task config: a dict, DictConfig or, for fairseq's
    argparse tasks, a Namespace."""
    if isinstance(task_cfg, argparse.Namespace):
        return getattr(task_cfg, "_name", None)
    return task_cfg.get("_name", None) if task_cfg is not None else None


def is_electra_model_cfg(model_cfg) -> bool:
    """Whether a checkpoint's model config names this plugin's ELECTRA model or an arch of it."""
    name = model_cfg.get("_name", None) if model_cfg is not None else None
    cls = ARCH_MODEL_REGISTRY.get(name) or MODEL_REGISTRY.get(name)
    electra = MODEL_REGISTRY.get("electra")
    return cls is not None and electra is not None and issubclass(cls, electra)


def load_checkpoint(path, arg_overrides: Optional[Dict[str, Any]] = None,
                    mmap: bool = False) -> Dict[str, Any]:
    """Read an ELECTRA checkpoint into CPU memory.

    Returns fairseq's checkpoint dict with ``cfg`` as a DictConfig (``arg_overrides`` applied
    as ``load_model_ensemble_and_task`` does) and ``model`` the state dict. Raises a one-line
    ElectraUsageError when the file is missing, is not a PyTorch checkpoint, or does not hold
    this plugin's model (:func:`~.checkpoint_file.read_checkpoint_file` says what a file
    that is not a checkpoint is).
    """
    path = os.fspath(path)
    state = read_checkpoint_file(path, mmap)
    if state.get("cfg") is None:
        raise ElectraUsageError(
            f"{path} has no fairseq config ('cfg'); checkpoints from fairseq before its hydra "
            f"configs are not supported")
    cfg = state["cfg"]
    if not OmegaConf.is_config(cfg):
        cfg = OmegaConf.create(cfg, flags={"allow_objects": True})
    if arg_overrides:
        overwrite_args_by_name(cfg, arg_overrides)
    state["cfg"] = cfg
    model_cfg = cfg.get("model", None)
    if not is_electra_model_cfg(model_cfg):
        name = model_cfg.get("_name", None) if model_cfg is not None else None
        raise ElectraUsageError(
            f"{path} is not an ELECTRA checkpoint (its model is '{name}', expected 'electra' "
            f"or an electra_* architecture)")
    if not any(k.startswith("discriminator.") for k in state["model"]):
        raise ElectraUsageError(f"{path} is not an ELECTRA checkpoint (no discriminator weights)")
    return state


# the entry of a loaded checkpoint's weights that holds its file and model settings
SETTINGS_KEY = "_electra_settings"


def remember_settings(state, path) -> None:
    """Put into the weights ``state["model"]``, as an entry (which a copy of the dict keeps),
    their file and the model settings they were trained with, completed from the arch:
    fairseq hands a model only the weights, and ``ElectraModel.load_state_dict`` takes the
    entry out (:func:`take_settings`) to compare them before it loads anything."""
    weights, cfg = state.get("model"), (state.get("cfg") or {}).get("model", None)
    if not isinstance(weights, MutableMapping) or not is_electra_model_cfg(cfg):
        return
    try:
        cfg = complete_config(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)))
    except (ElectraUsageError, OmegaConfBaseException):
        return  # a config that cannot build a model fails where it is built, with its line
    weights[SETTINGS_KEY] = {"file": os.fspath(path),  # plain values: ranks pickle it
                             "model": OmegaConf.to_container(cfg, resolve=True,
                                                             enum_to_str=True)}


def take_settings(state_dict) -> Tuple[Optional[str], Optional[DictConfig]]:
    """(file, completed model settings) that :func:`remember_settings` put into a checkpoint's
    weights, removed from them; (None, None) for weights that came another way."""
    entry = state_dict.pop(SETTINGS_KEY, None)
    if entry is None:
        return None, None
    return entry["file"], OmegaConf.create(entry["model"])


def import_user_dir(cfg) -> None:
    """Imports the ``--user-dir`` a checkpoint was trained with (its own kinds, bodies...)
    when it is there, as fairseq does before it builds a checkpoint's task."""
    common = cfg.get("common", None) if cfg is not None else None
    user_dir = common.get("user_dir", None) if common is not None else None
    if not user_dir or not os.path.isdir(user_dir):
        return
    if os.path.basename(os.path.normpath(user_dir)) in sys.modules:
        return  # imported already: the plugin itself (maybe by another path), or the module
    from fairseq import utils

    utils.import_user_module(common)
