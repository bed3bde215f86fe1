"""The one error type the plugin raises for bad user input, and its command-line edge."""

import os
import sys

PREFIX = "electra_plugin: error: "


def _one_line(message) -> str:
    return " ".join(str(message).split())  # whatever was quoted into it


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of a library's exception message (its type when empty), for quoting
    in a one-line error."""
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:limit]


class ElectraUsageError(ValueError):
    """A problem with the user's data, options or files, as one line naming the fix.

    Library code raises it; a Python caller (hub interface, notebook, server) catches it
    like any ``ValueError``. Only command lines turn it into the line and exit status 1:
    our own through :func:`command_line`, and fairseq's (``fairseq-train``,
    ``fairseq-hydra-train`` ... with ``--user-dir``) through :class:`CommandLineExit`.
    """

    def __new__(cls, message=""):
        if cls is ElectraUsageError and _in_fairseq_command_line():
            # fairseq's trainer and hydra turn every Exception into a traceback, but let
            # SystemExit through: there the error leaves as one
            return CommandLineExit(message)
        return super().__new__(cls, message)

    def __init__(self, message=""):
        self.message = _one_line(message)
        super().__init__(PREFIX + self.message)


class CommandLineExit(SystemExit):
    """:class:`ElectraUsageError` in a fairseq command-line process: exits with the line."""

    def __init__(self, message=""):
        self.message = _one_line(message)
        super().__init__(PREFIX + self.message)


def _in_fairseq_command_line() -> bool:
    """Whether this process runs fairseq's command line (or ``electra-train``, which is it)."""
    main = sys.modules.get("__main__")
    module = getattr(getattr(main, "__spec__", None), "name", None) or ""
    program = os.path.basename(sys.argv[0]) if sys.argv else ""
    return module.startswith("fairseq_cli.") or program.startswith("fairseq-") or \
        program == "electra-train" or module == "electra_plugin.cli.train"


def command_line(main):
    """Run a script's ``main()``; an :class:`ElectraUsageError` ends it with its one line and
    exit status 1 instead of a traceback. Logging is set up here, once per command."""
    from .logs import configure_logging

    configure_logging()
    try:
        return main()
    except ElectraUsageError as error:
        sys.exit(str(error))
