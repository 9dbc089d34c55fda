"""Cleanup that a second Ctrl-C must not cut short: stopping a warmup, recording why, releasing the lock.

A CI runner's `timeout` forwards Ctrl-C twice; an impatient user presses it twice. The first one
starts the cleanup; one that comes during it waits (its Python handler is swapped for one that only
notes it, which also holds where other threads exist, unlike a signal mask) and is raised as
before once the cleanup is done, so every target's warmup is ended before gpuops says it was.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator, List

_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Run the block to its end whatever Ctrl-C or SIGTERM arrives; then raise the first that did."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: List[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: came.append(signum)) for sig in _HELD}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if came:
            _deliver(came[0], previous[signal.Signals(came[0])])


def _deliver(signum: int, handler: Any) -> None:
    """What the signal would have done, now."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL and signum == signal.SIGINT:
        raise KeyboardInterrupt()
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)
