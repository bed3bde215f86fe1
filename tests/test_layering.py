"""The package's layering, folder by folder: commands -> tasks/criterions/tools/run safety ->
models -> model variants -> model core -> data -> base; every module in one layer, no
import from a layer above, and no import circles.

Read from the source (every ``from ... import`` of a plugin module, inside functions too),
so a lazy import that hides a circle counts as one.
"""

import ast
from pathlib import Path

from helpers import REPO


PACKAGE = REPO / "electra_plugin"
# A layer is a list of folders (packages) and top-level modules; a module belongs to the
# longest of them that contains it, so models/ is the layer of its own modules (electra.py,
# loading.py ...) and its subfolders sit below it. A layer may import the ones after it,
# never one before it.
ROOT = "electra_plugin"  # the package's __init__: registers everything (this name only)
LAYERS = [
    # commands: what a user runs
    (ROOT, "electra_plugin.__main__", "electra_plugin.cli"),
    # what fairseq loads by name, the tools around checkpoints, the run's safety machinery
    ("electra_plugin.tasks", "electra_plugin.criterions", "electra_plugin.convert",
     "electra_plugin.finetuning", "electra_plugin.run"),
    # the model: its assembly, loading and hub interface
    ("electra_plugin.models",),
    # its variants, one file each
    ("electra_plugin.models.generators", "electra_plugin.models.objectives"),
    # what every model is built from and stored as (the run settings it completes, the AUC
    # counts it logs); the optimizer and the speed work
    ("electra_plugin.models.core", "electra_plugin.models.bodies", "electra_plugin.optim",
     "electra_plugin.speed", "electra_plugin.metrics"),
    # data, never the models: corpora, vocabularies, masking, the task formats
    ("electra_plugin.data",),
    # the base everything may use: what a user sees of a command, what is installed where
    ("electra_plugin.user_io", "electra_plugin.environment", "electra_plugin.profiling"),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def plugin_imports():
    """{module: set of plugin modules (or packages) it imports anywhere in its source}."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] \
                    if node.level else []
                full = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    candidate = f"{full}.{alias.name}"
                    targets.add(candidate if (PACKAGE.parent / candidate.replace(".", "/")).
                                with_suffix(".py").exists() else full)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {t for t in targets if t.startswith("electra_plugin") and t != name}
    return graph


def layer_of(module):
    """The layer of the longest folder or module entry containing ``module``."""
    best, depth = -1, None
    for index, layer in enumerate(LAYERS):
        for entry in layer:
            inside = module == entry or (entry != ROOT and module.startswith(entry + "."))
            if inside and len(entry) > best:
                best, depth = len(entry), index
    return depth


def test_no_layer_imports_a_layer_above_it():
    graph = plugin_imports()
    upward = [(m, t) for m, targets in graph.items() for t in targets
              if layer_of(m) is not None and layer_of(t) is not None
              and layer_of(t) < layer_of(m)]
    assert not upward, upward
    assert "electra_plugin.models.electra" in graph  # the walk found the package


def test_every_module_is_in_a_layer():
    graph = plugin_imports()
    missing = sorted(m for m in graph if layer_of(m) is None)
    assert not missing, f"modules in no layer (add them to LAYERS): {missing}"
    assert len(graph) > 40  # the walk found the package's modules


def test_no_import_circles():
    graph = plugin_imports()
    # modules only: an edge to a package stands for its __init__
    seen, on_path, circles = set(), [], []

    def visit(module):
        if module in on_path:
            circles.append(on_path[on_path.index(module):] + [module])
            return
        if module in seen:
            return
        seen.add(module)
        on_path.append(module)
        for target in sorted(graph.get(module, ())):
            if target != "electra_plugin":  # the package's __init__ registers everything
                visit(target)
        on_path.pop()

    for module in sorted(graph):
        visit(module)
    assert not circles, circles[:3]


# The rooms that run the algorithm import speed/ in two files: the task (its one entry,
# PretrainingSpeed) and the model (the sampling, bucketing and module-walk kernels). The
# bodies and core call speed/'s kernels where they are needed; the plugin's __init__
# installs speed/'s wraps of fairseq and composes electra_adam with speed/'s Adam parts.
ALGORITHM = ("electra_plugin.tasks", "electra_plugin.criterions", "electra_plugin.models.electra",
             "electra_plugin.models.generators", "electra_plugin.run", "electra_plugin.optim")
SPEED_IMPORTERS = {"electra_plugin.tasks.electra_pretraining", "electra_plugin.models.electra"}


def test_the_algorithm_imports_speed_in_two_files():
    graph = plugin_imports()
    importers = {m for m, targets in graph.items()
                 if (m in ALGORITHM or m.startswith(tuple(a + "." for a in ALGORITHM)))
                 and any(t.split(".")[:2] == ["electra_plugin", "speed"] for t in targets)}
    assert importers == SPEED_IMPORTERS
