"""The run's log as the watchdog reads it: by offset, through truncations, rewrites, renames and deletes.

A rewrite is told by more than the size: the file's inode, and a fingerprint (the last bytes read
before the offset) that must still be there; a log truncated and rewritten past its old size in one
burst is read again from byte 0. A log renamed (`mv log log.1`) or deleted is still written by the
job through its open descriptor, so it is read on (a reader that comes later opens it through
/proc/PID/fd of the run's processes); a new file at the path is taken up only once the
old one has been silent for SWITCH_AFTER seconds (its writer moved on). A restarted watchdog finds
a renamed log again by its inode among the run directory's files.
"""

from __future__ import annotations

import os
import time
from typing import Any, BinaryIO, Optional, Tuple

from ..system.procs import marked
from ..wire import protocol as p

#: Bytes before the offset that must be unchanged for the log to be the one read so far.
FINGERPRINT = 64
#: A new file at the log's path is followed once the old one wrote nothing for this long.
SWITCH_AFTER = 2.0


class LogFile:
    """One run's log: `read()` gives the bytes beyond the offset, and says when it had to start again."""

    def __init__(self, d: str, offset: int = 0, inode: int = 0) -> None:
        self.d = d
        self.path = os.path.join(d, p.LOG)
        self.offset, self.inode = offset, inode
        self.fh: Optional[BinaryIO] = None
        self.tail = b""  # the last bytes read before the offset (empty after a restart: not known)
        self.silent_since: Optional[float] = None
        self.moved_on = False  # the writer moved on to a new file at the path: take that one
        self.last_writer_look = 0.0

    def read(self, size: int) -> Tuple[bytes, Optional[str]]:
        """(the bytes beyond the offset, why reading started again from byte 0 first, or None)."""
        why = None
        if self.fh is None:
            why = self._open()
            if self.fh is None:
                return b"", None
        why = self._check() or why
        data = self.fh.read(size)
        if data:
            self.offset += len(data)
            self.tail = (self.tail + data[-FINGERPRINT:])[-FINGERPRINT:]
            self.silent_since = None
            return data, why
        self._moved_on()
        return b"", why

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None

    # -- what happened to the file -----------------------------------------------------------
    def _open(self) -> Optional[str]:
        fh: Optional[BinaryIO]
        try:
            fh = open(self.path, "rb")
        except OSError:
            fh = self._from_writers()
            if fh is None:
                return None
        st = os.fstat(fh.fileno())
        why = None
        if self.inode and st.st_ino != self.inode:
            renamed = None if self.moved_on else self._find_inode()
            if renamed is not None:
                fh.close()
                fh = renamed
            else:
                why = "the log was replaced"
                self._restart()
        self.fh, self.moved_on = fh, False
        self.inode = os.fstat(fh.fileno()).st_ino
        if os.fstat(fh.fileno()).st_size < self.offset:
            why = why or "the log was truncated"
            self._restart()
        fh.seek(self.offset)
        return why

    def _from_writers(self) -> Optional[BinaryIO]:
        """No file at the path (deleted, or renamed away): the log as the job still holds it open,
        through /proc/PID/fd of the run's processes (tried at most once a second)."""
        now = time.monotonic()
        if now - self.last_writer_look < 1.0:
            return None
        self.last_writer_look = now
        gone_name = self.path + " (deleted)"
        for pid in marked(os.path.basename(self.d)):
            folder = "/proc/%d/fd" % pid
            try:
                fds = os.listdir(folder)
            except OSError:
                continue
            for fd in fds:
                link = os.path.join(folder, fd)
                try:
                    st = os.stat(link)
                    same = st.st_ino == self.inode if self.inode else os.readlink(link) == gone_name
                    if same and os.path.isfile(link):
                        return open(link, "rb")
                except OSError:
                    continue
        return None

    def _find_inode(self) -> Optional[BinaryIO]:
        """The log this watchdog read before its restart, renamed within the run directory."""
        try:
            names = os.listdir(self.d)
        except OSError:
            return None
        for name in names:
            full = os.path.join(self.d, name)
            try:
                if os.stat(full).st_ino == self.inode and os.path.isfile(full):
                    return open(full, "rb")
            except OSError:
                continue
        return None

    def _check(self) -> Optional[str]:
        """Truncated (shorter than the offset), or rewritten (the fingerprint is gone): back to byte 0."""
        assert self.fh is not None
        fd = self.fh.fileno()
        try:
            size = os.fstat(fd).st_size
            if size < self.offset:
                self._restart()
                return "the log was truncated"
            if self.tail and os.pread(fd, len(self.tail), self.offset - len(self.tail)) != self.tail:
                self._restart()
                return "the log was rewritten"
        except OSError:
            return None
        return None

    def _moved_on(self) -> None:
        """Another file at the path and the one read is silent: once its writer moved on, follow the new one."""
        try:
            st = os.stat(self.path)
        except OSError:
            return  # renamed away or deleted: read on, the job still writes it
        if st.st_ino == self.inode:
            self.silent_since = None
            return
        now = time.monotonic()
        self.silent_since = self.silent_since or now
        if now - self.silent_since >= SWITCH_AFTER:
            self.close()  # the next read opens the new file: "the log was replaced"
            self.silent_since, self.moved_on = None, True

    def _restart(self) -> None:
        self.offset, self.tail = 0, b""
        if self.fh is not None:
            self.fh.seek(0)


def last_line(d: str, masker: Any) -> Optional[str]:
    """The log's last non-blank line, masked then cut: why a stalled run stalled, at a glance."""
    try:
        with open(os.path.join(d, p.LOG), "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 4096))
            tail = fh.read()
    except OSError:
        return None
    for raw in reversed(tail.replace(b"\r", b"\n").split(b"\n")):
        text = raw.decode("utf-8", "replace").strip()
        if text:
            return masker.cut(text, 300, keep_end=True)
    return None
