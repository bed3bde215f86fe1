"""The registry of fine-tuning kinds (:mod:`.registry`) and the built-in kinds. Trials,
evaluation and conversion ask the registry, never a kind by name: a kind from a ``--user-dir``
module registers itself on import (``@register_kind``) and runs through them as the built-in
ones do."""

from .base import (TASK_FILE, Evaluation, FinetuningKind, HfHead, PreparedTask,
                   read_task_file, write_task_file)
from .registry import (KINDS, hf_heads, kind_named, kind_of_fairseq_task, prepared_task,
                       record_task, register_kind, write_test_outputs)
# the built-in kinds, in this order
from . import sentence, tagging, squad, choice  # noqa: E402,F401,I001

__all__ = ["KINDS", "TASK_FILE", "Evaluation", "FinetuningKind", "HfHead", "PreparedTask",
           "register_kind", "record_task", "kind_named", "kind_of_fairseq_task", "hf_heads",
           "prepared_task", "read_task_file", "write_task_file", "write_test_outputs"]
