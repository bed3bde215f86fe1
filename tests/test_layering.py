"""The package's layering: commands -> tasks/criterions -> models -> data, and no import circles.

Read from the source (every ``from ... import`` of a plugin module, inside functions too),
so a lazy import that hides a circle counts as one.
"""

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "electra_plugin"
# a layer may import the ones after it, never one before it
LAYERS = [("electra_plugin.cli", "electra_plugin.demo", "electra_plugin.train_cli"),
          ("electra_plugin.tasks", "electra_plugin.criterions", "electra_plugin.convert",
           "electra_plugin.crash_safety", "electra_plugin.checkpoint"),
          ("electra_plugin.models",),
          ("electra_plugin.data",)]  # the library the commands call: never a command


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
    for depth, layer in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in layer):
            return depth
    return None


def test_no_layer_imports_a_layer_above_it():
    graph = plugin_imports()
    upward = [(m, t) for m, targets in graph.items() for t in targets
              if layer_of(m) is not None and layer_of(t) is not None
              and layer_of(t) < layer_of(m)]
    assert not upward, upward
    assert "electra_plugin.models.electra" in graph  # the walk found the package


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
