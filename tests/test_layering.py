"""The package's layering: commands -> tasks/criterions/tools -> models -> model parts ->
data and run-time guards -> base, every module in one layer, and no import circles.

Read from the source (every ``from ... import`` of a plugin module, inside functions too),
so a lazy import that hides a circle counts as one.
"""

import ast
from pathlib import Path

from helpers import REPO


PACKAGE = REPO / "electra_plugin"
# a layer may import the ones after it, never one before it; every module is in one
ROOT = "electra_plugin"  # the package's __init__: registers everything (this name only)
MODELS = "electra_plugin.models"  # the models package's __init__ (this name only)
LAYERS = [
    # commands: what a user runs
    (ROOT, "electra_plugin.cli", "electra_plugin.demo", "electra_plugin.train_cli"),
    # what fairseq loads by name, and the tools around checkpoints
    ("electra_plugin.tasks", "electra_plugin.criterions", "electra_plugin.convert",
     "electra_plugin.crash_safety", "electra_plugin.finetuning"),
    # the model and what loads it
    ("electra_plugin.models.electra", "electra_plugin.models.hub_interface"),
    # what a model is built from: its variants, parts, FLOPs count, optimizer, speed work,
    # and the checkpoint files they read
    ("electra_plugin.generators", "electra_plugin.objectives", "electra_plugin.models.encoder",
     "electra_plugin.models.heads", "electra_plugin.models.span_head",
     "electra_plugin.models.collapse",
     "electra_plugin.models.checkpoint_settings", "electra_plugin.checkpoint",
     "electra_plugin.flops", "electra_plugin.optim", "electra_plugin.speed"),
    # data (never the models), the model's configuration and the run-time guards
    ("electra_plugin.data", "electra_plugin.glue", "electra_plugin.models.config", MODELS,
     "electra_plugin.divergence", "electra_plugin.save_dir_lock",
     "electra_plugin.run_config"),
    # the base everything may use
    ("electra_plugin.errors", "electra_plugin.logs", "electra_plugin.output_dir",
     "electra_plugin.optional",
     "electra_plugin.partial_output", "electra_plugin.splitmix", "electra_plugin.fixed_dtype",
     "electra_plugin.auc"),
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
    for depth, layer in enumerate(LAYERS):
        if any(module == p or (p not in (ROOT, MODELS) and module.startswith(p + "."))
               for p in layer):
            return depth
    return None


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
