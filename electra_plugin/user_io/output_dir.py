"""The one rule of every command for an output directory that already holds files.

A command never writes over files it finds there unless asked (``--force``; the converter
and electra-extract also take their older ``--overwrite``), and the refusal names the
files and that flag the same way in every command. :func:`lacks` names what a directory
lacks of a command's output, for the readers that check one before they use it.
"""

import os
from typing import Callable, List, Optional, Sequence

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


def lacks(directory: str, paths: Sequence[str]) -> Optional[str]:
    """``lacks a, b ...``: the files of ``paths`` (relative to ``directory``) that are not
    there, a missing folder named once (``label/``), for a line saying why a directory is not
    a command's output; None when every one is there."""
    missing: List[str] = []
    for path in paths:
        if os.path.isfile(os.path.join(directory, path)):
            continue
        folder, _, _ = path.rpartition("/")
        if folder and not os.path.isdir(os.path.join(directory, folder)):
            path = folder + "/"
        if path not in missing:
            missing.append(path)
    if not missing:
        return None
    return "lacks " + ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else "")
