"""The one switch of :mod:`electra_plugin.speed`: the ``ELECTRA_SPEED`` environment variable."""

import os

VARIABLE = "ELECTRA_SPEED"


def enabled(part: str = "") -> bool:
    """False when ``ELECTRA_SPEED=0``: every speed path then takes the plain PyTorch /
    fairseq op. ``ELECTRA_SPEED=-window`` (a comma-separated list of ``-part``) turns off
    only the parts named, so that a benchmark can weigh one of them in the same process.
    Read at each call (a dictionary lookup), so a test can flip it."""
    value = os.environ.get(VARIABLE, "1")
    return value != "0" and not (part and f"-{part}" in value.split(","))

