"""Sleep until a run's files change: inotify on Linux (ctypes, stdlib only), a 20 ms poll elsewhere.

The watchdog and the follower wait here instead of polling the log: a process blocked in
select() on an inotify descriptor costs nothing until the log grows, is truncated, replaced or
deleted, or a record (exit_code, abort.json, started, ...) appears in the run directory. The
wait also ends when one of the caller's own descriptors is readable (the GPU sampler's pipe, the
training's pidfd), one it waits on for a hangup alone hangs up (the pane's terminal: typed input
does not wake it), or after `timeout` seconds (the heartbeat), so a missed event costs at most one
heartbeat period, never a match. Where inotify cannot be had (no ctypes or libc, not Linux, the
per-user instance limit, GPUOPS_AGENT_NO_INOTIFY=1, a kernel that never delivers its events) the
wait is the old poll: it returns every POLL seconds and the caller reads as before.

A log that streams changes with every write the trainer makes: woken by each, the watchdog read a
line at a time (20% of a core at 20 MB/s, against 4% for the 20 ms poll). A change that comes within
GATHER seconds of the last one is therefore reported GATHER after that one, so the bytes of a
streaming log are read in one go a few milliseconds apart; the first change after a quiet spell
is reported at once (a line's match is not delayed by a log that was silent).
"""

from __future__ import annotations

import errno
import os
import select
import struct
import time
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence

if TYPE_CHECKING:
    import ctypes

POLL = 0.02
#: While a watched file keeps changing, at most one wake per GATHER seconds (its writes read together).
GATHER = 0.01
#: Events of the watched files: growth, a changed size or mode (truncation), a rename or deletion.
IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
FILE_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVE_SELF | IN_DELETE_SELF
DIR_MASK = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE
_HEAD = struct.Struct("iIII")
#: Timeouts in a row after which the watched file had grown though no event came: inotify is no use here.
MISSES_TO_POLL = 3
#: Seconds of polling after inotify missed MISSES_TO_POLL changes in a row, before it is tried again.
RETRY_AFTER = 30.0
NO_INOTIFY_ENV = "GPUOPS_AGENT_NO_INOTIFY"
#: Descriptors can be waited on for a hangup alone (poll(); select() would also wake on typed input).
HANGUPS = hasattr(select, "poll")


def _libc() -> Optional[ctypes.CDLL]:
    """libc's inotify calls, or None where there are none (not Linux, no ctypes, turned off)."""
    if os.environ.get(NO_INOTIFY_ENV) == "1":
        return None
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        for name in ("inotify_init1", "inotify_add_watch", "inotify_rm_watch"):
            getattr(libc, name)
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return libc
    except (ImportError, OSError, AttributeError):
        return None


class Waker:
    """Waits for a change of the named files of directory `d` (or of any other name there, less `quiet`)."""

    def __init__(self, d: str, files: Sequence[str], quiet: Iterable[str] = ()) -> None:
        self.d, self.files, self.quiet = d, tuple(files), set(quiet)
        self.fd: Optional[int] = None
        self.watches: Dict[int, Optional[str]] = {}  # watch descriptor -> file name (None: the directory)
        self.misses = 0
        self.timed_out = False  # the last wait ended by its timeout
        #: Since the last wait began, something other than the watched files may have changed (a record
        #: appeared or went, the wait timed out, or the wait polls and cannot tell): look at the records.
        self.records = True
        self.last_change = 0.0  # monotonic: when a wait last returned for a changed file
        self.why_poll = ""
        self.closed: Optional[str] = None  # once closed: its mode until then
        self.retry_at = 0.0  # monotonic: when inotify, given up for missing events, is tried again
        self.libc = _libc()
        if self.libc is None:
            self.why_poll = "inotify turned off" if os.environ.get(NO_INOTIFY_ENV) == "1" else "no inotify here"
            return
        self._start()

    def _start(self) -> None:
        assert self.libc is not None
        self.watches, self.misses = {}, 0
        fd = self.libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            self.why_poll = "inotify_init1: %s" % os.strerror(self._errno())
            return
        self.fd = fd
        if self._add(None) is None:
            self._close_fd()
            return
        for name in self.files:
            self._add(name)

    @property
    def mode(self) -> str:
        """`inotify`, or `poll (why)`: what status says of the watchdog's waiting."""
        if self.closed is not None:
            return self.closed  # the run ended: how it waited until then
        return "inotify" if self.fd is not None else "poll (%s)" % self.why_poll

    def _errno(self) -> int:
        import ctypes

        return ctypes.get_errno() or errno.EIO

    def _add(self, name: Optional[str]) -> Optional[int]:
        """Watch the directory (name None) or one file in it (again: a replaced file is a new inode)."""
        assert self.fd is not None and self.libc is not None
        path = self.d if name is None else os.path.join(self.d, name)
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), DIR_MASK if name is None else FILE_MASK)
        if wd < 0:
            if name is None:
                self.why_poll = "inotify_add_watch: %s" % os.strerror(self._errno())
            return None
        for old in [w for w, n in self.watches.items() if n == name and w != wd]:
            self.libc.inotify_rm_watch(self.fd, old)  # the watch of the file that was moved away
            del self.watches[old]
        self.watches[wd] = name
        return wd

    def wait(self, timeout: float, fds: Sequence[int] = (), hangups: Sequence[int] = ()) -> List[int]:
        """Block until a watched file changed, one of `fds` is readable, one of `hangups` hung up, or
        `timeout` passed (poll mode: at most POLL). Those of `fds` and `hangups` that are ready (empty when
        a file changed or time ran out)."""
        self.timed_out = False
        if self.fd is None and self.retry_at and time.monotonic() >= self.retry_at:
            self.retry_at = 0.0
            self._start()
        if self.fd is None:
            self.records = True
            return _ready(list(fds), list(hangups), min(max(0.0, timeout), POLL))
        self.records = False
        deadline = time.monotonic() + timeout
        while True:
            ready = _ready([self.fd, *fds], list(hangups), max(0.0, deadline - time.monotonic()))
            theirs = [f for f in ready if f != self.fd]
            if theirs:
                return theirs
            if not ready:
                self.timed_out = self.records = True
                return []
            if self._drain():
                self.misses = 0
                self._gather()
                return []

    def _gather(self) -> None:
        """A change soon after the last one: let the writes gather for the rest of GATHER (see above)."""
        now = time.monotonic()
        early = self.last_change + GATHER - now
        if early > 0:
            time.sleep(early)
            now += early
        self.last_change = now

    def _drain(self) -> bool:
        """Read the pending events: True when one is of interest (re-watching a file that was replaced)."""
        assert self.fd is not None
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            self.records = True
            return True
        woke, pos = False, 0
        while pos + _HEAD.size <= len(data):
            wd, mask, _, size = _HEAD.unpack_from(data, pos)
            name = data[pos + _HEAD.size: pos + _HEAD.size + size].split(b"\0", 1)[0].decode("utf-8", "replace")
            pos += _HEAD.size + size
            if mask & IN_Q_OVERFLOW:
                woke = self.records = True
                continue
            if wd not in self.watches:
                continue  # a watch given up already (the file moved away and its name is watched anew)
            whose = self.watches[wd]
            if whose is None:  # the directory: a record appeared, or a watched file was (re)created or moved
                if name in self.files and mask & (IN_CREATE | IN_MOVED_TO):
                    self._add(name)
                if name in self.files or (name not in self.quiet and not name.endswith(".tmp")):
                    woke = self.records = True
                continue
            woke = True  # a watched file changed
            if mask & IN_IGNORED:
                self.watches.pop(wd, None)
            if mask & (IN_IGNORED | IN_MOVE_SELF | IN_DELETE_SELF):
                self._add(whose)  # the name may be another file now (or none yet: the directory tells)
        return woke

    def missed(self) -> None:
        """The caller found its file grown after a timeout that no event ended: after a few in a row,
        inotify is taken for blind here (a file system that sends no events) and the wait polls."""
        if self.fd is None or not self.timed_out:
            return
        self.misses += 1
        if self.misses >= MISSES_TO_POLL:
            # Not for good: a log renamed away and still written (`mv log log.1`) sends its events to no
            # watched name until its writer moves on; inotify is tried again after RETRY_AFTER.
            self.why_poll = "inotify sent no events"
            self._close_fd()
            self.retry_at = time.monotonic() + RETRY_AFTER

    def close(self) -> None:
        """No more waits (the run ended): mode goes on saying how it waited."""
        if self.closed is None:
            self.closed = self.mode
        self._close_fd()

    def _close_fd(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd = None
        self.watches = {}


def _ready(fds: List[int], hangups: List[int], timeout: float) -> List[int]:
    """The fds readable (or hung up) and the hangups hung up, or [] once timeout passed (a signal is no
    error). Without poll() (not Linux), select() on fds alone."""
    if not HANGUPS:
        try:
            return select.select(fds, [], [], timeout)[0]
        except InterruptedError:
            return []
        except (OSError, ValueError):  # a descriptor that went away: the caller sees it on its next read
            return list(fds)
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    for fd in hangups:
        poller.register(fd, 0)  # POLLHUP, POLLERR and POLLNVAL are reported whatever is asked
    try:
        return [fd for fd, _ in poller.poll(timeout * 1000.0)]
    except InterruptedError:
        return []
    except (OSError, ValueError):
        return fds + hangups
