"""The tail every command module shares, written once: ``main`` for a command made of
subcommands, and the console script around any ``main``."""

import sys

from ..user_io.errors import command_line
from .vocabulary import json_output


def subcommands(build_parser):
    """``main(argv=None)`` of a command whose subcommands each set ``run``: parse, run the
    chosen one (with ``--json`` its one JSON object is all of standard output), return 0.
    A usage error is raised as :class:`~electra_plugin.user_io.errors.ElectraUsageError`."""
    def main(argv=None):
        args = build_parser().parse_args(argv)
        with json_output(args):
            args.run(args)
        return 0
    return main


def console(main):
    """The console script of ``main`` (and ``python -m electra_plugin.cli.NAME``): a usage
    error ends it with its one line and exit status 1."""
    return lambda: sys.exit(command_line(main))
