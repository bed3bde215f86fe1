"""Logging of the plugin's commands: set up once, at the command-line edge, with a level per
logger.

Importing fairseq leaves the root logger at DEBUG with a stderr handler (its
``models/wav2vec/wav2vec2_classification.py`` calls ``logging.basicConfig(level=DEBUG)`` at
import), so every library's debug messages would reach the terminal: drawing the demo's
curves printed 153 lines of matplotlib's font manager. Setting up replaces that handler.
"""

import logging
import os
import sys
import time

# libraries that log their workings at INFO or DEBUG, of no use to a user of the commands
QUIET = ("matplotlib", "PIL", "urllib3", "filelock", "fsspec", "h5py", "numba")


class _Elapsed(logging.Formatter):
    """Seconds since logging was set up (the command's start), as the progress lines' clock."""

    def __init__(self, fmt):
        super().__init__(fmt)
        self.start = time.time()

    def format(self, record):
        record.elapsed = record.created - self.start
        return super().format(record)


def command_name() -> str:
    """``electra-prepare`` for the console script and for ``python -m
    electra_plugin.cli.prepare`` alike."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("electra_plugin.cli."):
        return "electra-" + spec.name.rsplit(".", 1)[1]
    return os.path.basename(sys.argv[0]) or "electra_plugin"


def configure_logging(command=None, stream=None):
    """Progress lines as ``command: [  12.3s] message`` on stderr: the plugin's and
    fairseq's loggers at INFO, the libraries in :data:`QUIET` at WARNING."""
    import fairseq  # noqa: F401  (its import configures logging; ours must come after)

    command = command or command_name()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_Elapsed(f"{command}: [%(elapsed)6.1fs] %(message)s"))
    logging.basicConfig(handlers=[handler], level=logging.INFO, force=True)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
