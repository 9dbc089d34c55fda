"""Follow a run's log by byte offset on a raw channel; reconnect and resume without loss or repeats.

A small stdlib-only Python program runs on the target. It sends framed messages:
`D <inode> <offset> <len>` + bytes, `T <inode>` (truncated: back to 0), `R` (rotated:
a new file), `H <now> <size> <mtime>` (heartbeat, every second: liveness and stall),
`E <how> <code>` (the run ended and the log is drained). No message for `dead_after`
seconds means a dead peer: the client reconnects and resumes from its offset. A heartbeat's
size is -1 while unknown and -2 while the log file is missing (its mtime is then the last
growth seen, else when it was found missing).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

from gpuops.command import Cmd, Raw, Script
from gpuops.errors import ConnectError, GpuopsError
from gpuops.runs import run_dir

REMOTE_FOLLOWER = r'''
import os, sys, time, subprocess
d, offset, inode, tail, session, once = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6] == "1"
log = os.path.join(d, "log"); out = sys.stdout.buffer
def w(b):
    out.write(b); out.flush()
def ended():
    for name, how in (("abort.json", b"abort"), ("exit_code", b"exit")):
        try:
            with open(os.path.join(d, name), "rb") as fh:
                text = fh.read(65536).strip()
        except OSError:
            continue
        if how == b"exit":
            return b"exit " + (text if text.lstrip(b"-").isdigit() else b"-1")
        return b"abort -"
    return None
def tail_offset(path, n):
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, 2); pos = end; seen = 0; block = 65536
            while pos > 0:
                step = min(block, pos); pos -= step; fh.seek(pos); buf = fh.read(step)
                if pos + step == end and buf.endswith(b"\n"):
                    buf = buf[:-1]
                for i in range(len(buf) - 1, -1, -1):
                    if buf[i] == 10:
                        seen += 1
                        if seen == n:
                            return pos + i + 1
            return 0
    except OSError:
        return 0
if tail >= 0 and offset == 0:
    offset = tail_offset(log, tail) if tail > 0 else os.path.getsize(log) if os.path.exists(log) else 0
f = None; last_hb = 0.0; last_sess = time.time(); end = None; size = -1; mtime = 0.0
while True:
    if f is None:
        try:
            f = open(log, "rb")
            st = os.fstat(f.fileno())
            if inode and st.st_ino != inode:
                offset = 0
            inode = st.st_ino
            if st.st_size < offset:
                offset = 0; w(b"T %d\n" % inode)
            f.seek(offset)
        except OSError:
            f = None
            if size != -2:
                size = -2; mtime = mtime or time.time()
    got = False
    if f is not None:
        data = f.read(1 << 20)
        if data:
            w(b"D %d %d %d\n" % (inode, offset, len(data)) + data)
            offset += len(data); got = True
        else:
            try:
                st = os.stat(log)
            except OSError:
                st = None
            if st is None or st.st_ino != inode:
                f.close(); f = None; offset = 0; inode = 0; w(b"R\n"); continue
            size, mtime = st.st_size, st.st_mtime
            if st.st_size < offset:
                offset = 0; f.seek(0); w(b"T %d\n" % inode); continue
    now = time.time()
    if not got:
        if end is not None:
            w(b"E " + end + b"\n"); break
        if once:
            w(b"E once -\n"); break
        end = ended()
        if end is None and session and now - last_sess >= 1.0:
            last_sess = now
            alive = subprocess.call(["tmux", "has-session", "-t", "=" + session], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0
            if not alive:
                end = ended() or b"gone -"
        if end is None:
            time.sleep(0.02)
    if now - last_hb >= 1.0:
        w(b"H %.3f %d %.3f\n" % (now, size, mtime)); last_hb = now
'''


@dataclass
class Data:
    inode: int
    offset: int
    data: bytes


@dataclass
class Heartbeat:
    now: float
    size: int
    mtime: float


@dataclass
class Ended:
    how: str  # exit | abort | gone | once | container-stopped | container-missing
    code: int | None


@dataclass
class Reset:
    """The log was truncated or replaced: what follows starts at offset 0 of the new file."""

    why: str


@dataclass
class Reconnecting:
    error: str
    attempt: int


@dataclass
class Reconnected:
    offset: int


FollowEvent = Data | Heartbeat | Ended | Reset | Reconnecting | Reconnected


def follower_command(run_id: str, session: str, offset: int, inode: int, tail: int, once: bool) -> Cmd:
    script = Script(
        f"D={run_dir(run_id)}",
        Cmd("exec", "python3", "-u", "-c", REMOTE_FOLLOWER) + [Raw('"$D"'), str(offset), str(inode), str(tail), session, "1" if once else "0"],
    )
    return Cmd("bash", "-c", script)


class _Frames:
    """Incremental parser of the follower's framed output."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, chunk: bytes) -> Iterator[FollowEvent]:
        self.buf += chunk
        while True:
            nl = self.buf.find(b"\n")
            if nl < 0:
                return
            head = bytes(self.buf[:nl]).split(b" ")
            kind = head[0]
            if kind == b"D":
                inode, offset, length = int(head[1]), int(head[2]), int(head[3])
                if len(self.buf) < nl + 1 + length:
                    return
                data = bytes(self.buf[nl + 1 : nl + 1 + length])
                del self.buf[: nl + 1 + length]
                yield Data(inode, offset, data)
                continue
            del self.buf[: nl + 1]
            if kind == b"H":
                yield Heartbeat(float(head[1]), int(head[2]), float(head[3]))
            elif kind == b"E":
                code = head[2] if len(head) > 2 else b"-"
                yield Ended(head[1].decode(), int(code) if code.lstrip(b"-").isdigit() else None)
            elif kind == b"T":
                yield Reset("truncated")
            elif kind == b"R":
                yield Reset("rotated")


class LogFollower:
    """Yields the log's bytes from an offset, heartbeats and the end; survives dropped connections."""

    def __init__(
        self,
        transport,
        run_id: str,
        session: str,
        *,
        offset: int = 0,
        tail: int = -1,
        once: bool = False,
        dead_after: float = 6.0,
        give_up_after: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.transport = transport
        self.run_id = run_id
        self.session = session
        self.offset = offset
        self.inode = 0
        self.tail = tail
        self.once = once
        self.dead_after = dead_after
        self.give_up_after = give_up_after
        self.clock = clock
        self._stream = None
        self.reconnects = 0

    def close(self) -> None:
        if self._stream is not None:
            try:
                self._stream.close()
            except Exception:  # the connection may already be gone
                pass
            self._stream = None

    def _open(self) -> None:
        cmd = follower_command(self.run_id, self.session, self.offset, self.inode, self.tail, self.once)
        self._stream = self.transport.open(cmd)
        self.tail = -1  # only the first open starts from the tail

    def __iter__(self) -> Iterator[FollowEvent]:
        down_since: float | None = None
        attempt = 0
        while True:
            try:
                if self._stream is None:
                    self._open()
                    if down_since is not None:
                        self.reconnects += 1
                        yield Reconnected(self.offset)
                    down_since, attempt = None, 0
                yield from self._pump()
                return
            except (ConnectError, OSError, EOFError, _Dead) as exc:
                self.close()
                now = self.clock()
                down_since = down_since if down_since is not None else now
                if now - down_since > self.give_up_after:
                    raise ConnectError(self.transport.label, f"lost the connection and could not get it back in {self.give_up_after:g}s") from None
                attempt += 1
                yield Reconnecting(str(exc) or type(exc).__name__, attempt)
                # Said first: when the host itself is down, this check waits out the connect retries.
                gone = self._container_gone() if isinstance(exc, _Dead) and exc.closed else None
                if gone:
                    # Reconnecting cannot help: the run went down with its container.
                    yield Ended("container-" + gone, None)
                    return
                time.sleep(min(5.0, 0.2 * (2 ** min(attempt, 5))))
                try:
                    self.transport.reconnect()
                except GpuopsError as exc2:
                    if not isinstance(exc2, ConnectError) or "HOST KEY" in str(exc2) or "authentication" in str(exc2):
                        raise

    def _container_gone(self) -> str | None:
        """`stopped` or `missing` when the target is a container that no longer runs, else None."""
        state = getattr(self.transport, "state", None)
        if state is None:
            return None
        try:
            now = state(timeout=30.0)
        except GpuopsError:  # the host is unreachable: the reconnect loop deals with that
            return None
        return now if now in ("stopped", "missing") else None

    def _pump(self) -> Iterator[FollowEvent]:
        frames = _Frames()
        last = self.clock()
        assert self._stream is not None
        while True:
            chunk = self._stream.read(0.5)
            now = self.clock()
            if chunk is None:
                if now - last > self.dead_after:
                    raise _Dead(f"no word from {self.transport.label} for {self.dead_after:g}s")
                continue
            if chunk == b"":
                # An exit status means the connection is up and the follower itself ended (killed, or its
                # container stopped); none (-1 from paramiko) means the connection dropped.
                code = self._stream.wait(2.0)
                raise _Dead("the connection closed", closed=code is not None and code >= 0)
            last = now
            for event in frames.feed(chunk):
                if isinstance(event, Data):
                    if event.offset != self.offset and self.inode == event.inode:
                        raise _Dead(f"offset mismatch: expected {self.offset}, got {event.offset}")
                    self.inode = event.inode
                    self.offset = event.offset + len(event.data)
                elif isinstance(event, Reset):
                    self.offset, self.inode = 0, 0
                elif isinstance(event, Ended):
                    yield event
                    self.close()
                    return
                yield event


class _Dead(Exception):
    """The follower's stream stopped answering; `closed`: the remote command ended without its E frame."""

    def __init__(self, message: str, *, closed: bool = False) -> None:
        super().__init__(message)
        self.closed = closed
