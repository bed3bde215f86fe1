"""Where the plugin's directory and its hydra recipes are: inside the installed package
(``electra_plugin/recipes/NAME``, setup.py maps them there), or, in a clone, where the
repository keeps them (``examples/NAME/config``)."""

import importlib.util
import os

from ..user_io.errors import ElectraUsageError

RECIPES = ("pretraining", "glue")
PLUGIN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # electra_plugin/


def user_dir() -> str:
    """The directory fairseq's ``--user-dir`` (hydra: ``common.user_dir``) takes."""
    return PLUGIN


def recipes_dir(name: str) -> str:
    """The ``--config-dir`` of the ``name`` recipes (pretraining, glue)."""
    if name not in RECIPES:
        raise ElectraUsageError(f"no recipes named {name!r}; choose one of {', '.join(RECIPES)}")
    try:
        spec = importlib.util.find_spec(f"electra_plugin.recipes.{name}")
    except ModuleNotFoundError:  # a clone on sys.path, not installed
        spec = None
    for where in ([*spec.submodule_search_locations] if spec else []) + [
            os.path.join(os.path.dirname(PLUGIN), "examples", name, "config")]:
        if os.path.isdir(where):
            return os.path.abspath(where)
    raise ElectraUsageError(f"the {name} recipes are missing from {PLUGIN}; reinstall the "
                            f"plugin (pip install electra-fairseq)")
