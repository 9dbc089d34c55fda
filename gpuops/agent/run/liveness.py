"""Is the current attempt's training still running? Its pane's pid answers for free; tmux only confirms.

The training runs as `exec bash sh/run.sh RUN_ID` in its tmux session's one pane. Once that
session exists (the `started` record), its pane pid is read from tmux once and then watched with
a pidfd (it wakes the watchdog's wait the moment the process ends) or, where there is none, a
look at /proc/<pid>/stat (the same start time: a reused pid is another process). While that
process lives the run lives and no tmux is spawned. run.sh survives SIGHUP (to record the exit
code), so a session killed while a training that ignores SIGHUP lives on is seen from the pane's
terminal: held open (never read), it hangs up the moment tmux closes the pane. Where no pidfd or
terminal can be had, one `has-session` every BACKSTOP seconds stands in for it. Only a confirmed
end ends a run: when the pid is gone or the terminal hung up, tmux.gone() must confirm (its server
says no such session, or no server answers and no process of the run is left); a tmux error, a
pid that cannot be read or found keeps the run alive and the old twice-a-second tmux check runs
until one is sure.

A tmux may end a pane only once every holder of its terminal has closed it (3.3a does not wait):
the terminal is let go as soon as the pidfd says the pane process ended, and it is held only where
there is a pidfd, so no tmux is kept waiting.
"""

from __future__ import annotations

import os
import select
from typing import List, Optional, Sequence

from ..system import tmux
from ..system.procs import running
from ..system.wake import HANGUPS
from ..wire import protocol as p

#: Seconds between tmux checks while nothing is known for sure (no pane pid yet, or it ended).
CHECK_EVERY = 0.5
#: Seconds between the tmux checks that back up a live pane pid whose terminal is not held.
BACKSTOP = 10.0


def _start_ticks(pid: int) -> Optional[bytes]:
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            return fh.read(4096).rsplit(b")", 1)[-1].split()[19]
    except (OSError, IndexError):
        return None


def _terminal(pid: int) -> Optional[int]:
    """The pane's terminal (its process's stdin), opened to be told of its hangup; None where it is none."""
    try:
        fd = os.open("/proc/%d/fd/0" % pid, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if os.isatty(fd):
        return fd
    os.close(fd)
    return None


def _readable(fd: int) -> bool:
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _close(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def _cmdline(pid: int) -> List[bytes]:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return fh.read(65536).split(b"\0")
    except OSError:
        return []


class Liveness:
    """The training of one attempt, seen from the watchdog (or a follower): call gone(now) at each wake,
    wait on fds() and hangups(), and tell saw() what the wait found ready."""

    def __init__(self, d: str, session: str, run_id: str, seen: bool = False) -> None:
        self.d, self.session, self.run_id = d, session, run_id
        self.seen = seen  # the session existed once: from then on its absence is an end
        self.pid: Optional[int] = None
        self.ticks: Optional[bytes] = None
        self.pidfd: Optional[int] = None
        self.tty: Optional[int] = None  # the pane's terminal, held (never read) for its hangup
        self.next_check = 0.0
        self.tmux_calls = 0

    def fds(self) -> List[int]:
        """The pidfd to wait on (readable once the training's pane process ended)."""
        return [self.pidfd] if self.pidfd is not None else []

    def hangups(self) -> List[int]:
        """The pane's terminal, to wait on for its hangup only (the session killed, the pane process alive)."""
        return [self.tty] if self.tty is not None else []

    def saw(self, ready: Sequence[int]) -> None:
        """What a wait found ready: the pane process ended (the pid is let go), or its terminal hung up
        (let go). Either way tmux is asked at the next gone()."""
        if self.pidfd is not None and self.pidfd in ready:
            self.forget()
            self.next_check = 0.0
        elif self.tty is not None and self.tty in ready:
            _close(self.tty)
            self.tty, self.next_check = None, 0.0

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
            return
        self.tty = _terminal(pid) if HANGUPS else None
        if self.tty is not None and _readable(self.pidfd):  # ended meanwhile: the terminal may be another's
            _close(self.tty)
            self.tty = None

    def _pid_alive(self) -> bool:
        """Without a pidfd (whose end saw() is told of): /proc, with the same start time."""
        if self.pid is None:
            return False
        return self.pidfd is not None or (running(self.pid) and _start_ticks(self.pid) == self.ticks)

    def forget(self) -> None:
        """The pid is of no more use (its process ended, or another attempt began): its pidfd and its
        terminal are let go (see above: no tmux waits on the terminal for us)."""
        _close(self.tty)
        _close(self.pidfd)
        self.tty = self.pidfd = None
        self.pid = self.ticks = None

    def gone(self, now: float) -> bool:
        """True once the session is confirmed gone (after it was seen, or once training started)."""
        if self.pid is not None:
            if self._pid_alive():
                if now < self.next_check:
                    return False
                self.next_check = now + BACKSTOP if self.tty is None else float("inf")
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
                self.next_check = now + BACKSTOP if self.tty is None else float("inf")
                return False
        self.tmux_calls += 1
        gone = tmux.gone(self.session, self.run_id)  # a tmux error is no end
        self.seen = self.seen or started or not gone
        return gone and self.seen

    def close(self) -> None:
        self.forget()
