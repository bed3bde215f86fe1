"""The one switch of :mod:`electra_plugin.speed`: the ``ELECTRA_SPEED`` environment variable."""

import os

VARIABLE = "ELECTRA_SPEED"


def enabled() -> bool:
    """False when ``ELECTRA_SPEED=0``: every speed path then takes the plain PyTorch /
    fairseq op. Read at each call (a dictionary lookup), so a test can flip it."""
    return os.environ.get(VARIABLE, "1") != "0"
