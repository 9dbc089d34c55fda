"""The process-wide reader/writer lock of the compile guard, built for a cheap shared side.

A cached compiled call only appends its thread id to ``READERS`` and reads ``BUSY[0]`` (no lock
taken); the condition is used only while a writer (a first call) waits or holds, and by readers
that meet one. Writer-preferring, re-entrant per thread (a compiled call inside a compiled
call never waits for itself), and a thread holding the shared side may take the exclusive one
(its shared holds are set aside meanwhile, so two such threads never wait for each other).
List append/remove and the reads of ``BUSY`` are single operations under the interpreter lock.
"""

from __future__ import annotations

import threading
import time

from . import counts

#: Thread ids of the shared holders (one entry per hold; a thread may hold several, nested).
READERS: list = []
#: Writers waiting or holding: non-zero sends readers to the slow path.
BUSY = [0]
#: The thread holding the exclusive side, or None.
WRITER: list = [None]
_COND = threading.Condition(threading.Lock())


def shared_slow(me: int) -> None:
    """The shared side when a writer waits or holds; `me` is in READERS on entry and on return."""
    if WRITER[0] == me or READERS.count(me) > 1:  # inside our own first call, or nested in a shared hold
        return
    with _COND:
        READERS.remove(me)
        _COND.notify_all()
        try:
            if BUSY[0]:
                start = time.monotonic()
                while BUSY[0]:
                    _COND.wait()
                counts.COUNTS.waits += 1
                counts.COUNTS.waited += time.monotonic() - start
        finally:  # also on a Ctrl-C in the wait: the caller's `finally` removes it, and the trainer sees the KeyboardInterrupt
            READERS.append(me)


def wake() -> None:
    """A shared hold ended while a writer waits: let it look at READERS again."""
    with _COND:
        _COND.notify_all()


def acquire_exclusive(me: int) -> int:
    """Take the exclusive side; returns how many shared holds of this thread were set aside."""
    with _COND:
        held = READERS.count(me)
        for _ in range(held):
            READERS.remove(me)
        BUSY[0] += 1
        try:
            if WRITER[0] is not None or READERS:
                start = time.monotonic()
                while WRITER[0] is not None or READERS:
                    _COND.wait()
                counts.COUNTS.waits += 1
                counts.COUNTS.waited += time.monotonic() - start
        except BaseException:  # interrupted while waiting: leave the lock as we found it
            BUSY[0] -= 1
            READERS.extend([me] * held)
            _COND.notify_all()
            raise
        WRITER[0] = me
        return held


def release_exclusive(me: int, held: int) -> None:
    """End the exclusive hold and give this thread its shared holds back (no writer can hold now)."""
    with _COND:
        WRITER[0] = None
        BUSY[0] -= 1
        READERS.extend([me] * held)
        _COND.notify_all()
