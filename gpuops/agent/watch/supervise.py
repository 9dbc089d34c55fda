"""Keep a run's watchdog alive: start it, and start it again within seconds whenever it dies or freezes.

`python3 -m gpuops_agent supervise RUN_ID`, started detached (its own session, no terminal, no
run marker) by start.py. It ends once the watchdog says it is done (watchdog.json `state: done`:
the run is over and its records are written), on SIGTERM (a launch that could not start training
takes it down), or once the run's directory is deleted (nothing is left to watch or write). Any
other end of the watchdog (a crash, `kill`, an exit 0 that did not finish the run) is followed by a
restart. The watchdog pulses a byte down its stdout (a pipe)
every heartbeat, which needs no disk: no pulse for FROZEN_AFTER seconds (SIGSTOP, a read stuck
on a dead NFS mount) and it is killed and started again. A bookkeeping write that fails (a full
disk) never ends the supervisor.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from typing import Any, List, Optional

from .. import LIB
from ..run.prepare import append_event
from ..wire import protocol as p
from ..wire.records import read_json

#: Restart delays: quick after a kill; backing off (never past 4 s) while the watchdog keeps crashing.
FIRST_DELAY, MAX_DELAY = 0.2, 4.0
#: Give up after this many crashes in a row that each came within CRASH_WINDOW seconds of the start.
MAX_FAST_CRASHES, CRASH_WINDOW = 30, 2.0
#: A watchdog silent this long (no pulse) is frozen: killed and started again. Its first pulse may
#: take longer (START_WITHIN: a loaded machine imports slowly), and so may its last steps (reap, drain).
FROZEN_AFTER, START_WITHIN = 8.0, 30.0


def watchdog_argv(run_id: str) -> List[str]:
    return [sys.executable, "-E", "-s", "-m", p.PACKAGE, "watchdog", run_id]


def note(d: str, event: str, **data: Any) -> None:
    """An event for the run's events.jsonl; a write that fails (a full disk) is dropped, never fatal."""
    try:
        append_event(d, event, **data)
    except OSError:
        pass


def done(d: str) -> bool:
    """The watchdog finished the run (its last heartbeat says so)."""
    return (read_json(os.path.join(d, p.WATCHDOG)) or {}).get("state") == "done"


def watch_child(child: subprocess.Popen, stopping: List[bool]) -> Optional[float]:
    """Wait for the watchdog to end; None when it did, the seconds it was silent when it froze."""
    assert child.stdout is not None
    fd = child.stdout.fileno()
    last, limit = time.monotonic(), START_WITHIN
    while True:
        try:
            ready, _, _ = select.select([fd], [], [], 0.5)
        except InterruptedError:
            ready = []
        if ready:
            try:
                data = os.read(fd, 4096)
            except OSError:
                data = b""
            if not data:  # the watchdog closed its end: it is ending
                child.wait()
                return None
            last, limit = time.monotonic(), FROZEN_AFTER
        if child.poll() is not None:
            return None
        silent = time.monotonic() - last
        if silent > limit and not stopping[0]:
            child.kill()  # SIGKILL: also ends a stopped (SIGSTOP) process
            child.wait()
            return silent


def main(argv: List[str]) -> int:
    (run_id,) = argv
    d = p.run_dir(run_id)
    with open(os.path.join(d, p.SUPERVISOR_PID), "w") as fh:
        fh.write("%d\n" % os.getpid())
    child: List[Optional[subprocess.Popen]] = [None]
    stopping = [False]

    def on_term(*_: object) -> None:
        stopping[0] = True
        if child[0] is not None and child[0].poll() is None:
            child[0].terminate()

    signal.signal(signal.SIGTERM, on_term)
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    restarts = fast = 0
    while not stopping[0]:
        started = time.monotonic()
        proc = child[0] = subprocess.Popen(watchdog_argv(run_id), cwd=LIB, stdin=subprocess.DEVNULL,
                                           stdout=subprocess.PIPE)
        frozen = watch_child(proc, stopping)
        assert proc.stdout is not None  # stdout=PIPE
        proc.stdout.close()
        code = proc.returncode
        if stopping[0] or done(d):
            return 0
        if not os.path.isdir(d):  # the run's records were deleted: nothing is left to watch or write
            return 0
        restarts += 1
        fast = fast + 1 if time.monotonic() - started < CRASH_WINDOW else 0
        if fast >= MAX_FAST_CRASHES:
            note(d, "watchdog_gave_up", restarts=restarts,
                 message="the watchdog crashed %d times in a row; clients watch the run themselves" % fast)
            return 1
        delay = min(MAX_DELAY, FIRST_DELAY * 2 ** fast) if fast else FIRST_DELAY
        how = {"signal": -code} if code is not None and code < 0 else {"exit": code}
        if frozen is not None:
            how["frozen"] = round(frozen, 1)
        note(d, "watchdog_restarted", restarts=restarts, delay=delay, **how)
        time.sleep(delay)
    return 0
