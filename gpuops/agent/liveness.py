"""Is the current attempt's training still running? Its pane's pid answers for free; tmux only confirms.

The training runs as `exec bash sh/run.sh RUN_ID` in its tmux session's one pane. Once that
session exists (the `started` record), its pane pid is read from tmux once and then watched with
a pidfd (it wakes the watchdog's wait the moment the process ends) or, where there is none, a
look at /proc/<pid>/stat (the same start time: a reused pid is another process). While that
process lives the run lives: no tmux is spawned, but for one `has-session` every BACKSTOP seconds
(a session killed while a training that ignores SIGHUP lives on ends the run as before). Only a
confirmed end ends a run: when the pid is gone, tmux.gone() must confirm (its server says no such
session, or no server answers and no process of the run is left); a tmux error, a pid that cannot
be read or found keeps the run alive and the old twice-a-second tmux check runs until one is sure.
"""

from __future__ import annotations

import os
import select
from typing import List, Optional

from . import protocol as p
from . import tmux
from .procs import running

#: Seconds between tmux checks while nothing is known for sure (no pane pid yet, or it ended).
CHECK_EVERY = 0.5
#: Seconds between the tmux checks that back up a live pane pid.
BACKSTOP = 10.0


def _start_ticks(pid: int) -> Optional[bytes]:
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            return fh.read(4096).rsplit(b")", 1)[-1].split()[19]
    except (OSError, IndexError):
        return None


def _cmdline(pid: int) -> List[bytes]:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return fh.read(65536).split(b"\0")
    except OSError:
        return []


class Liveness:
    """The training of one attempt, seen from the watchdog (or a follower): call gone(now) at each wake."""

    def __init__(self, d: str, session: str, run_id: str, seen: bool = False) -> None:
        self.d, self.session, self.run_id = d, session, run_id
        self.seen = seen  # the session existed once: from then on its absence is an end
        self.pid: Optional[int] = None
        self.ticks: Optional[bytes] = None
        self.pidfd: Optional[int] = None
        self.next_check = 0.0
        self.tmux_calls = 0

    def fds(self) -> List[int]:
        """The pidfd to wait on (readable once the training's pane process ended); once it was, it is let
        go (a readable fd would end every wait) and gone() finds the end from /proc."""
        if self.pidfd is not None and not self._pid_alive():
            self._close_fd()
        return [self.pidfd] if self.pidfd is not None else []

    def _close_fd(self) -> None:
        if self.pidfd is not None:
            try:
                os.close(self.pidfd)
            except OSError:
                pass
        self.pidfd = None

    def _learn(self) -> None:
        """The pane pid of the run's session, when it is this run's run.sh (one tmux call)."""
        self.tmux_calls += 1
        pid = tmux.pane_pid(self.session)
        if pid is None or self.run_id.encode() not in _cmdline(pid)[1:]:
            return
        ticks = _start_ticks(pid)
        if ticks is None:
            return
        self.pid, self.ticks = pid, ticks
        try:
            self.pidfd = os.pidfd_open(pid)  # type: ignore[attr-defined]  # Linux >= 5.3, Python >= 3.9
        except (AttributeError, OSError):
            self.pidfd = None

    def _pid_alive(self) -> bool:
        if self.pid is None:
            return False
        if self.pidfd is not None:
            try:
                return not select.select([self.pidfd], [], [], 0)[0]
            except (OSError, ValueError):
                pass
        return running(self.pid) and _start_ticks(self.pid) == self.ticks

    def forget(self) -> None:
        """The pid is of no more use (its process ended, or another attempt began)."""
        self._close_fd()
        self.pid = self.ticks = None

    def gone(self, now: float) -> bool:
        """True once the session is confirmed gone (after it was seen, or once training started)."""
        if self.pid is not None:
            if self._pid_alive():
                if now < self.next_check:
                    return False
                self.next_check = now + BACKSTOP
            else:
                self.forget()  # ended, or no longer readable: tmux confirms (or not), now
                self.next_check = 0.0
        if self.pid is None:
            if now < self.next_check:
                return False
            self.next_check = now + CHECK_EVERY
        started = os.path.exists(os.path.join(self.d, p.STARTED))  # before the check: then its answer is current
        if self.pid is None and started:
            self._learn()
            if self.pid is not None:  # tmux named the pane: the session is there
                self.seen = True
                self.next_check = now + BACKSTOP
                return False
        self.tmux_calls += 1
        gone = tmux.gone(self.session, self.run_id)  # a tmux error is no end
        self.seen = self.seen or started or not gone
        return gone and self.seen

    def close(self) -> None:
        self.forget()
