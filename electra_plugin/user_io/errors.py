"""The one error type the plugin raises for bad user input, and its command-line edge."""

import sys
from typing import Optional

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
    ``fairseq-hydra-train`` ... with ``--user-dir``) through
    :mod:`electra_plugin.run.command_line`.
    """

    def __init__(self, message=""):
        self.message = _one_line(message)
        super().__init__(PREFIX + self.message)


def usage_error_in_chain(error: BaseException) -> Optional[ElectraUsageError]:
    """The ElectraUsageError that ``error`` is or was raised from (fairseq's trainer wraps one
    raised while it loads a checkpoint in an exception of its own), or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, ElectraUsageError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def command_line(main, logs: bool = True):
    """Run a script's ``main()``; an :class:`ElectraUsageError` ends it with its one line and
    exit status 1 instead of a traceback. Logging is set up here, once per command (``logs``
    False: a command that logs nothing and so skips fairseq's import, seconds)."""
    if logs:
        from .logs import configure_logging

        configure_logging()
    try:
        return main()
    except ElectraUsageError as error:
        sys.exit(str(error))
