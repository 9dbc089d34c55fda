"""Start a run: its watchdog first (so it sees byte 0 of the log), then the training command in tmux.

`python3 -m gpuops_agent start RUN_ID`. The run directory was made by `prepare`. A watchdog
that cannot run fails the start before training does (exit 73, its own words), never leaving a
silent, unprotected run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import List

from .. import LIB, SH
from ..system import tmux
from ..wire import marks, watchfile
from ..wire import protocol as p
from ..wire.records import read_json, read_text
from .attempt import current

#: How long the watchdog may take to start and write its first heartbeat (a loaded machine is slow).
READY_TIMEOUT = 30.0


def supervisor_argv(run_id: str) -> List[str]:
    return [sys.executable, "-E", "-s", "-m", p.PACKAGE, "supervise", run_id]


def _clean_env() -> dict:
    """The watchdog carries no run marker (the reap kills every process that does)."""
    return {k: v for k, v in os.environ.items() if k not in ("GPUOPS_RUN_ID", "GPUOPS_RUN_DIR")}


def start_watchdog(run_id: str, d: str) -> subprocess.Popen:
    err = open(os.path.join(d, p.WATCHDOG_LOG), "ab")
    try:
        return subprocess.Popen(supervisor_argv(run_id), cwd=LIB, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True, env=_clean_env(), close_fds=True)
    finally:
        err.close()


def wait_ready(sup: subprocess.Popen, d: str) -> str:
    """'' once the watchdog wrote its first heartbeat; else why it did not."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        state = read_json(os.path.join(d, p.WATCHDOG))
        if state and state.get("state") == "watching":
            return ""
        if sup.poll() is not None:
            break
        time.sleep(0.02)
    said = (read_text(os.path.join(d, p.WATCHDOG_LOG), 1 << 20) or "").strip().splitlines()
    why = said[-1] if said else ("it did not start within %gs" % READY_TIMEOUT if sup.poll() is None else
                                 "it exited with code %s" % sup.returncode)
    return why[-300:]


def stop_watchdog(sup: subprocess.Popen) -> None:
    try:
        os.killpg(sup.pid, signal.SIGTERM)
    except OSError:
        pass


def start_training(run_id: str, d: str, session: str) -> subprocess.CompletedProcess:
    """Training (sh/run.sh) in its detached tmux session, and the `started` record once the session exists
    (also how the watchdog starts a restarted attempt)."""
    if watchfile.read_or_default(d).job is not None:  # a node of a torchrun job: a fresh rendezvous per attempt
        from ..wire.jobwire import rdzv_id
        from .attempt import current

        with open(os.path.join(d, p.RDZV_ID), "w") as fh:
            fh.write(rdzv_id(run_id, int(current(d)["attempt"])) + "\n")
    started = tmux.new_detached(session, d, ["exec", "bash", os.path.join(SH, "run.sh"), run_id, sys.executable,
                                             *attempt_args(d)], window=run_id)
    if started.returncode == 0:
        with open(os.path.join(d, p.STARTED), "w") as fh:
            fh.write("%.3f\n" % time.time())
    return started


def attempt_args(d: str) -> List[str]:
    """run.sh's ATTEMPT MAX_ATTEMPTS [RESTART_AFTER]: what the training sees as GPUOPS_ATTEMPT and the rest."""
    rec = current(d)
    n = int(rec["attempt"])
    total = int(rec.get("max_attempts") or watchfile.read_or_default(d).max_attempts)
    return [str(n), str(total)] + ([str(rec.get("after") or "")] if n > 1 else [])


def main(argv: List[str]) -> int:
    (run_id,) = argv
    d = p.run_dir(run_id)
    session = watchfile.read_or_default(d).session
    if os.path.exists(os.path.join(d, p.ABORT)):
        print(marks.mark("stopped"))
        return marks.STOPPED_EXIT
    if tmux.alive(session):
        print(marks.mark("session-exists"))
        return 75
    open(os.path.join(d, p.LOG), "ab").close()
    sup = start_watchdog(run_id, d)
    why = wait_ready(sup, d)
    if why:
        stop_watchdog(sup)
        print(marks.mark("watchdog-failed", why))
        return 73
    started = start_training(run_id, d, session)
    if started.returncode != 0:
        stop_watchdog(sup)
        sys.stderr.write(started.stderr.decode("utf-8", "replace"))
        return 71
    if os.path.exists(os.path.join(d, p.ABORT)):  # `gpuops stop` got in between: training must not go on
        tmux.kill(session)
        print(marks.mark("stopped"))
        return marks.STOPPED_EXIT
    # Started once tmux created the session: a command that fails at once may already have ended.
    print(marks.mark("started", run_id))
    return 0
