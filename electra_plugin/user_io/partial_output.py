"""Outputs that a failed write (a full disk, a file-size limit, a read-only file system)
leaves as they were, with one line instead of a traceback.

A command stopped half-way by a full disk would otherwise leave files that the next command
(fairseq-train, the hub, the converter) takes for a finished output. The writers run their
writing inside :func:`removed_on_failure`.
"""

import errno
import os
import re
import shutil
from contextlib import contextmanager

from .errors import ElectraUsageError

# what a destination answers when it cannot take more (the rest are the caller's bugs)
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}
# of those, the ones that more room would cure
FULL = {os.strerror(n) for n in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)}
# the errno as Python ("[Errno 28]") and Rust libraries (safetensors: "(os error 28)") quote it
QUOTED_ERRNO = re.compile(r"\[Errno (\d+)\]|\(os error (\d+)\)")


def full_destination(error) -> str:
    """Why a write failed when the destination could take no more (an OSError, another
    library's error or a log line quoting its errno; for an exception, also the ones it
    was raised from: torch.save turns the OSError into a RuntimeError), else ''."""
    while error is not None:
        number = getattr(error, "errno", None) if isinstance(error, OSError) else None
        if number is None:
            quoted = QUOTED_ERRNO.search(str(error))
            number = quoted and int(quoted.group(1) or quoted.group(2))
        if number in WRITE_ERRNOS:
            return os.strerror(number)
        error = error.__cause__ or error.__context__ if isinstance(error, BaseException) \
            else None
    return ""


def _fix(reason: str) -> str:
    return ("free space (or choose a destination on another disk)" if reason in FULL else
            "choose a destination you can write to")


def write_error(destination, reason: str) -> ElectraUsageError:
    return ElectraUsageError(
        f"cannot write into {destination} ({reason}); nothing of this run's output was left "
        f"there: {_fix(reason)} and run the same command again")


def unusable_destination(what: str, error: OSError) -> ElectraUsageError:
    """A destination refused before anything was written (it cannot be created, or a probe
    file cannot be written): ``what`` (``cannot create --out-dir 'x'``), why, and the fix."""
    reason = error.strerror or str(error)
    return ElectraUsageError(f"{what}: {reason}; {_fix(reason)}")


@contextmanager
def removed_on_failure(directory):
    """Run the body; if it fails, remove what it created in ``directory`` (the directory
    itself when the body created it), and give a full destination as :func:`write_error`."""
    directory = os.path.abspath(directory)
    before = set(os.listdir(directory)) if os.path.isdir(directory) else None
    try:
        yield
    except BaseException as error:
        if before is None:
            shutil.rmtree(directory, ignore_errors=True)
        elif os.path.isdir(directory):
            for name in set(os.listdir(directory)) - before:
                path = os.path.join(directory, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.remove(path)
        reason = full_destination(error)
        if reason:
            raise write_error(directory, reason) from None
        raise


@contextmanager
def written_whole(path):
    """A name next to ``path`` for the body to write to, renamed to ``path`` (os.replace, in
    the same directory) only once the body finished: a full disk or a kill leaves the old
    file or none, never a half-written one under its name. A full destination is given as
    :func:`write_error`."""
    partial = os.fspath(path) + ".tmp"
    try:
        yield partial
        os.replace(partial, path)
    except BaseException as error:
        if os.path.exists(partial):
            os.remove(partial)
        reason = full_destination(error)
        if reason:
            raise write_error(os.path.dirname(os.path.abspath(path)), reason) from None
        raise
