"""What a checkpoint was trained for, read from its config (``cfg.task._name``) before a
command uses it: pre-training, the discriminator alone, or fine-tuning on a task. A command
that needs one kind refuses another in one line, before it reads any data or starts a run,
instead of failing inside fairseq on what that other kind lacks."""

from dataclasses import dataclass
from typing import Optional, Tuple

from ..models.core.checkpoint import load_checkpoint, task_name
from ..user_io.errors import ElectraUsageError

PRETRAINING = "electra"  # the generator and the discriminator with their pre-training heads
DISCRIMINATOR = "masked_lm"  # the discriminator alone: electra-extract, electra-convert import


@dataclass(frozen=True)
class CheckpointKind:
    path: str
    cfg: object  # the checkpoint's config (a DictConfig)
    weights: Tuple[str, ...]  # the names of its tensors
    vocabulary: Optional[int] = None  # its token embeddings' rows: dict.txt's entries, <mask>

    @property
    def task(self) -> Optional[str]:
        return task_name(self.cfg.get("task", None))

    def has(self, prefix: str) -> bool:
        return any(name.startswith(prefix) for name in self.weights)

    def refusal(self, need: str) -> ElectraUsageError:
        """``--checkpoint PATH is <its kind>; <need>``."""
        if self.task == PRETRAINING:
            kind = "a pre-training checkpoint (task electra)"
        elif self.task == DISCRIMINATOR:
            kind = "a discriminator alone (task masked_lm: electra-extract, electra-convert import)"
        else:
            kind = f"a checkpoint fine-tuned with --task {self.task}"
        return ElectraUsageError(f"--checkpoint {self.path} is {kind}; {need}")


def read_kind(path: str) -> CheckpointKind:
    """The config, tensor names and vocabulary size of the checkpoint at ``path`` (its
    weights let go)."""
    state = load_checkpoint(path, mmap=True)  # its tensors' shapes alone are read
    rows = sorted((not name.startswith("discriminator."), tensor.shape[0])
                  for name, tensor in state["model"].items()
                  if name.endswith("word_embeddings.weight") and hasattr(tensor, "shape"))
    return CheckpointKind(path, state["cfg"], tuple(state["model"]),
                          rows[0][1] if rows else None)
