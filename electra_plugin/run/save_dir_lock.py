"""One training run per ``--save-dir``: a second run started into a live run's directory stops.

Two runs saving into one directory interleave their checkpoints (a double launch, a
scheduler's retry while the first job still runs), and the survivor resumes from whichever
wrote last. The run holds a POSIX record lock (``fcntl.lockf``) on ``.electra_train.lock`` in
the directory for as long as it lives; the kernel drops it when the process ends, however it
ends (SIGKILL, out of memory, a lost node), so a killed run never blocks its own resume.

Why a record lock and not ``flock``: an ``flock`` belongs to the open file, which the data
loader's worker processes inherit when fairseq forks them; they outlive a SIGKILLed trainer by
seconds, and for those seconds an immediate restart was refused. A record lock belongs to the
process that took it alone: forked children do not hold it. Its catch: the kernel drops it as
soon as the holder closes *any* descriptor of the file, so the holder opens the file once, keeps
that descriptor for its whole life and never opens the file again (a second call for the same
directory returns early).
"""

import errno
import logging
import os
import socket

from ..user_io.errors import ElectraUsageError

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock
    fcntl = None

logger = logging.getLogger(__name__)

LOCK_FILE = ".electra_train.lock"
_held = {}  # lock file path -> its descriptor, open for the life of the process (never closed)
_BUSY = (errno.EACCES, errno.EAGAIN)  # what F_SETLK answers when another process holds it
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def hold_save_dir(save_dir) -> None:
    """Lock ``save_dir`` for this process, or raise naming the process that holds it."""
    path = os.path.join(os.path.realpath(save_dir), LOCK_FILE)
    if path in _held or fcntl is None:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # close-on-exec: no child program
    except OSError as e:
        raise ElectraUsageError(f"cannot write into --save-dir {save_dir} "
                                f"({e.strerror or e}); give a writable --save-dir") from None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in _BUSY:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            os.close(fd)  # not the holder: closing drops nothing of the live run's
            raise ElectraUsageError(
                f"--save-dir {save_dir} is in use by a training run that is still alive "
                f"({holder or 'another process'}); two runs in one directory would interleave "
                f"their checkpoints: wait for it to end (or stop it, then run this command to "
                f"resume), or give this run another --save-dir") from None
        if e.errno not in _NO_LOCKS:
            os.close(fd)
            raise
        logger.warning(f"the file system of {save_dir} has no file locks ({e.strerror}): "
                       f"nothing stops a second run from saving into it")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    _held[path] = fd


def release_save_dirs() -> None:
    """Drop every lock this process holds: for a Python caller that trained in its own
    process and hands the directory on to another process (the next run holds it anew)."""
    while _held:
        os.close(_held.popitem()[1])
