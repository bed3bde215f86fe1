"""SIGTERM and SIGHUP (``timeout``, ``kill``, a scheduler, a closed terminal) stop a command's
child processes, as Ctrl-C does. By default Python dies on them at once, skipping the
``finally`` that stops the trials or the comparison's arms, which then train on alone."""

import contextlib
import os
import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """Raised where the block runs when one of SIGNALS arrives (a BaseException, like
    KeyboardInterrupt: no ``except Exception`` keeps the block going)."""

    def __init__(self, signum):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def stop(signum, frame):
    for other in SIGNALS:  # a second signal does not cut the unwinding short
        if signal.getsignal(other) is stop:
            signal.signal(other, signal.SIG_IGN)
    raise Stopped(signum)


@contextlib.contextmanager
def stopped_by_signals():
    """While the block runs, SIGNALS with their default action unwind it (its ``finally``
    stops what it started); then the process ends by that signal, as it would have. A signal
    with a handler of the caller's, or ignored, is left as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = [s for s in SIGNALS if signal.getsignal(s) == signal.SIG_DFL]
    for signum in ours:
        signal.signal(signum, stop)
    try:
        yield
    except Stopped as stopped:
        signal.signal(stopped.signum, signal.SIG_DFL)
        os.kill(os.getpid(), stopped.signum)
        raise  # (the default action ends the process before this)
    finally:
        for signum in ours:
            signal.signal(signum, signal.SIG_DFL)
