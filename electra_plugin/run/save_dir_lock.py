"""One training run per ``--save-dir``: a second run started into a live run's directory stops.

Two runs saving into one directory interleave their checkpoints (a double launch, a
scheduler's retry while the first job still runs), and the survivor resumes from whichever
wrote last. The run holds an ``flock`` on a file in the directory for as long as it lives;
the kernel drops it when the process ends, however it ends (SIGKILL, out of memory, a lost
node), so a killed run never blocks its own resume.
"""

import errno
import logging
import os
import socket

from ..errors import ElectraUsageError

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock
    fcntl = None

logger = logging.getLogger(__name__)

LOCK_FILE = ".electra_train.lock"
_held = {}  # lock file path -> its open file, kept open for the life of the process


def hold_save_dir(save_dir) -> None:
    """Lock ``save_dir`` for this process, or raise naming the process that holds it."""
    path = os.path.join(os.path.abspath(save_dir), LOCK_FILE)
    if path in _held or fcntl is None:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock = open(path, "a+")
    except OSError as e:
        raise ElectraUsageError(f"cannot write into --save-dir {save_dir} "
                                f"({e.strerror or e}); give a writable --save-dir") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise ElectraUsageError(
            f"--save-dir {save_dir} is in use by a training run that is still alive "
            f"({holder}); two runs in one directory would interleave their checkpoints: wait "
            f"for it to end (or stop it, then run this command to resume), or give this run "
            f"another --save-dir") from None
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        logger.warning(f"the file system of {save_dir} has no file locks ({e.strerror}): "
                       f"nothing stops a second run from saving into it")
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    lock.flush()
    _held[path] = lock
