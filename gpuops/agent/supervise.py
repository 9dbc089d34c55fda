"""Keep a run's watchdog alive: start it, and start it again within seconds whenever it dies.

`python3 -m gpuops_agent supervise RUN_ID`, started detached (its own session, no terminal, no
run marker) by start.py. It ends when the watchdog ends normally (the run is over and its records
are written), or on SIGTERM (a launch that could not start training takes it down).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import List, Optional

from . import protocol as p
from .records import read_json
from .runfiles import append_event

LIB = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Restart delays: quick after a kill; backing off (never past 4 s) while the watchdog keeps crashing.
FIRST_DELAY, MAX_DELAY = 0.2, 4.0
#: Give up after this many crashes in a row that each came within CRASH_WINDOW seconds of the start.
MAX_FAST_CRASHES, CRASH_WINDOW = 30, 2.0


def watchdog_argv(run_id: str) -> List[str]:
    return [sys.executable, "-E", "-s", "-m", p.PACKAGE, "watchdog", run_id]


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
        child[0] = subprocess.Popen(watchdog_argv(run_id), cwd=LIB, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        code = child[0].wait()
        if stopping[0] or code == 0 or (read_json(os.path.join(d, p.WATCHDOG)) or {}).get("state") == "done":
            return 0
        restarts += 1
        fast = fast + 1 if time.monotonic() - started < CRASH_WINDOW else 0
        if fast >= MAX_FAST_CRASHES:
            append_event(d, "watchdog_gave_up", restarts=restarts,
                         message="the watchdog crashed %d times in a row; clients watch the run themselves" % fast)
            return 1
        delay = min(MAX_DELAY, FIRST_DELAY * 2 ** fast) if fast else FIRST_DELAY
        how = {"signal": -code} if code < 0 else {"exit": code}
        append_event(d, "watchdog_restarted", restarts=restarts, delay=delay, **how)
        time.sleep(delay)
    return 0
