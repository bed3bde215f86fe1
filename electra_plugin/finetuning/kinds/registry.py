"""Where fine-tuning kinds register, and what asks them: by name, by fairseq task, by a
prepared directory."""

import os
from typing import Dict, List, Optional

from ...user_io.errors import ElectraUsageError
from .base import FinetuningKind, HfHead, PreparedTask, read_task_file, write_task_file

KINDS: Dict[str, FinetuningKind] = {}


def register_kind(cls):
    """Class decorator: registers an instance of the kind under its ``name``."""
    old = KINDS.get(cls.name)
    if old is not None and (type(old).__module__, type(old).__qualname__) != \
            (cls.__module__, cls.__qualname__):
        raise ValueError(f"a fine-tuning kind named {cls.name!r} is already registered")
    KINDS[cls.name] = cls()
    return cls


def kind_named(name: str) -> FinetuningKind:
    if name not in KINDS:
        raise ElectraUsageError(f"no fine-tuning kind {name!r} is registered (there are "
                                f"{', '.join(KINDS)}); a kind of your own registers from its "
                                f"--user-dir module")
    return KINDS[name]


def kind_of_fairseq_task(task: Optional[str]) -> Optional[FinetuningKind]:
    """The kind that trains with fairseq's ``--task task``, or None."""
    return next((k for k in KINDS.values() if k.fairseq_task == task), None)


def hf_heads() -> List[HfHead]:
    return [k.hf_head for k in KINDS.values() if k.hf_head is not None]


def prepared_task(directory: str, name: Optional[str] = None) -> Optional[PreparedTask]:
    """What a preparation command made ``directory``: its task file, or else the first kind
    whose layout its training split has (None: no kind's)."""
    recorded = read_task_file(directory)
    if recorded is not None:
        return recorded
    for kind in KINDS.values():
        if kind.data_problem(directory, ["train"]) is None:
            found = kind.describe(directory, name or os.path.basename(
                os.path.normpath(directory)))
            return PreparedTask(**{**found.__dict__, "directory": os.path.abspath(directory)})
    return None


def record_task(kind: str, directory: str, name: Optional[str] = None) -> Optional[str]:
    """A preparation command's last step: the task file of the directory it wrote (when it
    wrote a training split); -> its path."""
    found = kind_named(kind)
    if found.data_problem(directory, ["train"]) is not None:
        return None
    name = name or os.path.basename(os.path.normpath(directory))
    return write_task_file(directory, found.describe(directory, name))


def write_test_outputs(checkpoint: str, data: str, out_dir: str, cpu: bool = False) -> List[str]:
    """The test split(s) of ``data`` predicted by ``checkpoint`` and written into ``out_dir``
    as its fine-tuning kind writes them; -> the paths written. The checkpoint's kind is
    checked before the data is read."""
    from ...models.core.checkpoint_file import require_checkpoint_file
    from ..checkpoint_kind import read_kind

    require_checkpoint_file(checkpoint)
    finetuned = read_kind(checkpoint)
    kind = kind_of_fairseq_task(finetuned.task)
    if kind is None:
        raise finetuned.refusal("test-outputs needs one fine-tuned on the task (a trial's "
                                "checkpoint_last.pt: --task "
                                f"{' or '.join(k.fairseq_task for k in KINDS.values())})")
    return kind.write_test_outputs(checkpoint, finetuned.cfg["task"], data, out_dir, cpu)
