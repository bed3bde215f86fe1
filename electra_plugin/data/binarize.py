"""Running fairseq-preprocess from the plugin's commands, with one-line errors."""

import os
import subprocess
import sys
from typing import Dict, Optional

from ..errors import ElectraUsageError
from ..partial_output import full_destination, write_error

# electra-prepare builds its output in a hidden directory of --destdir with this
# prefix and moves it in when done: one left behind marks an interrupted run.
STAGING_PREFIX = ".prepare_data-"


def fairseq_preprocess(destdir: str, srcdict: Optional[str], splits: Dict[str, str],
                       workers: int = 1, log=None) -> None:
    """Binarize text files with ``fairseq-preprocess --only-source``.

    ``splits`` maps fairseq's options (``trainpref``, ``validpref``, ``testpref``) to file
    prefixes (comma-separated prefixes give valid, valid1, ...). The same interpreter runs
    it, so the environment is the caller's.
    """
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--only-source",
           "--destdir", destdir, "--workers", str(workers)]
    if srcdict:
        cmd += ["--srcdict", srcdict]
    for option, prefix in splits.items():
        cmd += [f"--{option}", prefix]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [line for line in proc.stdout.splitlines() if "tensorboardX" not in line]
    if log is not None:
        for line in lines:
            if "fairseq_cli.preprocess" in line and ("Dictionary:" in line or "sents," in line):
                log("fairseq-preprocess: " + line.rsplit("fairseq_cli.preprocess", 1)[1]
                    .lstrip(":| "))
    if proc.returncode != 0:
        reason = next(filter(None, map(full_destination, reversed(lines))), "")
        if reason:  # its traceback would say no more
            raise write_error(destdir, reason)
        sys.stderr.write("\n".join(lines[-20:]) + "\n")
        raise ElectraUsageError(f"fairseq-preprocess failed (exit {proc.returncode}): "
                                f"{lines[-1].strip() if lines else ''}")


def check_destdir(destdir: str, force: bool) -> None:
    """Refuse to write into a directory that already holds files, unless forced."""
    if os.path.isdir(destdir) and os.listdir(destdir) and not force:
        raise ElectraUsageError(
            f"{destdir} already holds files; choose an empty --destdir or pass --force to "
            f"write over them")
