"""Name what differs when a checkpoint of another model is loaded into this one.

A resume or restore with another ``--arch``, size, objective or generator used to surface as
the first tensor whose shape differed (the token embeddings, then blamed on the dictionary)
or, where the shapes agree (another head count, another objective), not at all.
:func:`check_model_settings` compares the model settings the checkpoint was trained with
(kept with its weights by :func:`electra_plugin.models.core.checkpoint.remember_settings`) with this
model's before anything is loaded.
"""

from ..errors import ElectraUsageError
from .core.config import arch_generator_size

# The settings that decide what a checkpoint's weights mean: sizes decide their shapes;
# heads, objective and generator what tensors of the same shapes compute. The
# discriminator's are compared for any model, the rest when this model pre-trains.
DISCRIMINATOR_SETTINGS = ("num_layers", "hidden_size", "num_heads", "ffn_size",
                          "embedding_size", "max_positions", "type_vocab_size")
PRETRAINING_SETTINGS = ("objective", "generator", "generator_size", "generator_layers",
                        "embedding_sharing", "two_stage_updates")


def check_model_settings(model, state_dict) -> None:
    """Raise naming every setting in which the checkpoint's model differs from ``model``.

    A vocabulary of another size alone is the data's dictionary; anything else is another
    model. Weights that did not come through fairseq's loader carry no settings and are left
    to the shape check of ``ElectraModel.load_state_dict``.
    """
    path, saved = getattr(state_dict, "electra_source", (None, None))
    if saved is None:
        return
    here = model.cfg
    names = DISCRIMINATOR_SETTINGS + (PRETRAINING_SETTINGS if model.pretraining else ())
    differ = [n for n in names if _effective(saved, n) != _effective(here, n)]
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
    return value


def _setting(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
