"""The one rule of every command for an output directory that already holds files.

A command never writes over files it finds there unless asked (``--force``; the converter
and electra-extract also take their older ``--overwrite``), and the refusal names the
files and that flag the same way in every command.
"""

import os
from typing import Callable, List, Optional

from .errors import ElectraUsageError

FLAG = "--force"


def refuse_existing(directory: str, force: bool,
                    clashes: Optional[Callable[[str], bool]] = None) -> List[str]:
    """The names in ``directory`` that this command would write over (every name, or those
    ``clashes`` picks: commands that share a directory with other outputs); refused unless
    ``force``."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ElectraUsageError(f"{directory} exists and is not a directory")
    present = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    present = [name for name in present if clashes is None or clashes(name)]
    if present and not force:
        shown = ", ".join(present[:3]) + (" ..." if len(present) > 3 else "")
        raise ElectraUsageError(f"{directory} already holds files ({shown}); choose an empty "
                                f"directory or pass {FLAG} to write over them")
    return present
