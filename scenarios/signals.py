"""A stop that keeps finished work: SIGTERM (a job scheduler's or `kill`'s polite stop) raises
KeyboardInterrupt, as Ctrl-C does, so a long command's Ctrl-C path (write what finished, one
line, exit 130) runs for it too."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


@contextmanager
def sigterm_as_interrupt():
    if threading.current_thread() is not threading.main_thread():     # only the main thread may set handlers
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
