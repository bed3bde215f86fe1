"""A benchmark suite in one YAML file: its tasks, each a name and the directory a
preparation command wrote, with optional changes to the recipe for that task::

    tasks:
      NSMC: data-bin/nsmc            # the kind's official recipe
      NER:
        data: data-bin/naver-ner
        epochs: 5                    # lr, layer_decay, epochs, max_update, batch_size,
        lr: 5e-5                     # warmup, weight_decay

Relative directories are read from the file's own directory."""

import dataclasses
import os
from typing import Dict, List, Tuple

from ..user_io.errors import ElectraUsageError

OVERRIDES = ("lr", "layer_decay", "epochs", "max_update", "batch_size", "warmup",
             "weight_decay")


def read_suite(path: str) -> List[Tuple[str, str, Dict[str, float]]]:
    """-> [(task name, data directory, recipe overrides)] in the file's order."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            suite = yaml.safe_load(f)
    except OSError as error:
        raise ElectraUsageError(f"cannot read --suite {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ElectraUsageError(f"--suite {path} is not YAML: {str(error).splitlines()[0]}") \
            from None
    tasks = suite.get("tasks") if isinstance(suite, dict) else None
    if not isinstance(tasks, dict) or not tasks:
        raise ElectraUsageError(f"--suite {path} has no 'tasks:' mapping of NAME: DIR (or NAME: "
                                f"{{data: DIR, epochs: ...}})")
    here = os.path.dirname(os.path.abspath(path))
    found = []
    for name, entry in tasks.items():
        entry = {"data": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or not isinstance(entry.get("data"), str):
            raise ElectraUsageError(f"--suite {path}: task {name} needs a data directory "
                                    f"({name}: DIR or {name}: {{data: DIR}})")
        unknown = sorted(set(entry) - {"data", *OVERRIDES})
        if unknown:
            raise ElectraUsageError(f"--suite {path}: task {name} sets {', '.join(unknown)}; a "
                                    f"task may change {', '.join(OVERRIDES)}")
        changes = {}
        for key in OVERRIDES:
            if key in entry:
                try:
                    changes[key] = (int if key in ("max_update", "batch_size") else float)(
                        entry[key])
                except (TypeError, ValueError):
                    raise ElectraUsageError(f"--suite {path}: task {name}: {key} "
                                            f"{entry[key]!r} is not a number") from None
        found.append((str(name), os.path.join(here, os.path.expanduser(entry["data"])),
                      changes))
    return found


def with_overrides(recipe, changes: Dict[str, float]):
    """``recipe`` with a task's changes (a dataclass of the same fields)."""
    return dataclasses.replace(recipe, **changes) if changes else recipe
