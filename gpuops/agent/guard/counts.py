"""The compile guard's counts, written where `gpuops status` reads them.

One small JSON file per Python process that compiled something, ``<run dir>/compile-guard-counts/<pid>.json``
(protocol.COMPILE_GUARD_COUNTS), rewritten atomically every few seconds while the counts change and once
at exit. A process that never calls ``torch.compile`` writes nothing; outside a gpuops run
(no GPUOPS_RUN_DIR) nothing is written at all.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time

#: Seconds between two writes of a process's counts (only when they changed).
WRITE_EVERY = 2.0
SCHEMA_VERSION = 1


class Counts:
    """Plain ints and floats, changed only under the guard's lock (first calls and waits are rare)."""

    def __init__(self) -> None:
        self.compiled = 0  # objects torch.compile returned, guarded
        self.serialized = 0  # first calls per signature run under the exclusive lock
        self.first_call_s = 0.0  # seconds those first calls took
        self.waits = 0  # calls that waited for the lock
        self.waited = 0.0  # seconds they waited in all
        self.unguarded = 0  # objects the guard could not wrap (an unknown compiled module shape)
        self.backward_holds = 0  # first calls whose lazy backward compile was kept exclusive too
        self.backward_timeouts = 0  # of those, released after backward.WAIT with no backward run

    def as_record(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "pid": os.getpid(),
            "phase": os.environ.get("GPUOPS_PHASE") or "training",
            "compiled": self.compiled,
            "serialized": self.serialized,
            "first_call_s": round(self.first_call_s, 3),
            "waits": self.waits,
            "waited_s": round(self.waited, 3),
            "unguarded": self.unguarded,
            "backward_holds": self.backward_holds,
            "backward_timeouts": self.backward_timeouts,
            "updated": round(time.time(), 3),
        }


COUNTS = Counts()
_started = [False]


def path() -> str:
    """Where this process writes its counts; '' outside a gpuops run."""
    from ..wire import protocol

    run_dir = os.environ.get("GPUOPS_RUN_DIR") or ""
    return os.path.join(run_dir, protocol.COMPILE_GUARD_COUNTS, "%d.json" % os.getpid()) if run_dir else ""


def write() -> bool:
    """Write the counts now (atomically: a temp file renamed); False where they cannot be written."""
    target = path()
    if not target:
        return False
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = "%s.tmp" % target
        with open(tmp, "w") as fh:
            fh.write(json.dumps(COUNTS.as_record(), sort_keys=True) + "\n")
        os.replace(tmp, target)
        return True
    except OSError:  # a full disk or a removed run directory must not break the training
        return False


def _loop() -> None:
    last = None
    while True:
        now = (COUNTS.compiled, COUNTS.serialized, COUNTS.waits, COUNTS.unguarded, round(COUNTS.waited, 3))
        if now != last and write():
            last = now
        time.sleep(WRITE_EVERY)


def start() -> None:
    """From the first guarded compile on: the periodic writer (a daemon thread) and the write at exit."""
    if _started[0] or not os.environ.get("GPUOPS_RUN_DIR"):
        return
    _started[0] = True
    atexit.register(write)
    threading.Thread(target=_loop, name="gpuops-compile-guard-counts", daemon=True).start()


def _after_fork() -> None:
    """A forked child (a DataLoader worker) counts for itself, under its own pid."""
    global COUNTS
    COUNTS = Counts()
    _started[0] = False


os.register_at_fork(after_in_child=_after_fork)
