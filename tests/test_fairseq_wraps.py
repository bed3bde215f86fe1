"""Every fairseq function the plugin wraps is listed in docs/design.md with the parameters it
was written against; a fairseq whose function takes other parameters, or a wrap the table
leaves out, fails here instead of misbehaving in a run."""

import importlib
import inspect
import re
import sys

import electra_plugin  # noqa: F401  (installs the wraps)
from helpers import REPO

ROW = re.compile(r"^\| `((?:fairseq|hydra)\.[\w.]+)\((.*?)\)` \| (.*?) \|", re.M)


def documented():
    """{dotted path: (parameters as written, wrapper names)} of docs/design.md's table."""
    text = (REPO / "docs" / "design.md").read_text()
    section = text.split("## What the plugin wraps in fairseq", 1)[1].split("\n## ", 1)[0]
    return {path: (params, set(re.findall(r"`(\w+)`", wrappers)))
            for path, params, wrappers in ROW.findall(section)}


def resolve(path):
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return getattr(obj, "fget", obj)  # a property: its getter
    raise ImportError(path)


def parameters(function) -> str:
    """fairseq's own parameters, written as the table writes them (no annotations)."""
    shown = []
    for p in inspect.signature(function).parameters.values():
        text = ("**" if p.kind is p.VAR_KEYWORD else "*" if p.kind is p.VAR_POSITIONAL
                else "") + p.name
        shown.append(text if p.default is p.empty else f"{text}={p.default!r}")
    return ", ".join(shown)


def wrappers_of(obj):
    """The plugin's wrappers stacked on ``obj``, outermost first."""
    found = []
    while getattr(obj, "electra_wrapper", None):
        found.append(obj.electra_wrapper)
        obj = obj.__wrapped__
    return found


def test_each_wrapped_function_takes_the_parameters_it_was_written_against():
    table = documented()
    assert len(table) >= 11
    for path, (params, wrappers) in table.items():
        obj = resolve(path)
        assert set(wrappers_of(obj)) == wrappers, (path, wrappers_of(obj))
        while hasattr(obj, "__wrapped__"):
            obj = obj.__wrapped__
        assert parameters(obj) == params, (path, parameters(obj))


def test_no_wrap_is_left_out_of_the_table():
    """Every function of fairseq's loaded modules (and their classes) that a plugin wrapper
    replaced is in the table."""
    table = documented()
    wrapped = set()
    for key, module in list(sys.modules.items()):
        if not key.startswith(("fairseq", "hydra")) or module is None:
            continue
        name = module.__name__  # fairseq also files some modules under a second name
        owners = [(name, vars(module))] + [
            (f"{name}.{cls.__name__}", vars(cls)) for cls in vars(module).values()
            if inspect.isclass(cls) and cls.__module__ == name]
        for owner, members in owners:
            for attr, value in members.items():
                if wrappers_of(getattr(value, "__func__", getattr(value, "fget", value))):
                    wrapped.add(f"{owner}.{attr}")
    assert wrapped == set(table), (wrapped ^ set(table))
