"""Follow a run's log and its watchdog's events by byte offset on a raw channel; reconnect and resume
without loss or repeats.

The target side is gpuops/agent/watch/follow.py; its frames are defined in gpuops/agent/wire/protocol.py.
No frame for `dead_after` seconds means a dead peer: the client reconnects and resumes from
its offsets. A heartbeat's size is -1 while unknown and -2 while the log file is missing (its
mtime is then the last growth seen, else when it was found missing); it also says how old the
watchdog's heartbeat is and how far it has matched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, Union

from gpuops.agent.wire.frames import Data, Ended, Heartbeat, Reset, WatchdogEvent
from gpuops.client.door import Door
from gpuops.client.door.channels import Closed, FollowChannel
from gpuops.errors import AuthError, ConnectError, GpuopsError, HostKeyError, RemoteError

__all__ = ["Data", "Ended", "FollowEvent", "Heartbeat", "LogFollower", "Reconnected", "Reconnecting", "Reset",
           "WatchdogEvent"]


@dataclass
class Reconnecting:
    error: str
    attempt: int


@dataclass
class Reconnected:
    offset: int


FollowEvent = Union[Data, Heartbeat, WatchdogEvent, Ended, Reset, Reconnecting, Reconnected]


class LogFollower:
    """Yields the log's bytes from an offset, heartbeats and the end; survives dropped connections."""

    def __init__(
        self,
        door: Door,
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
        self.door = door
        self.run_id = run_id
        self.session = session
        self.offset = offset
        self.inode = 0
        self.events_offset = 0
        self.tail = tail
        self.once = once
        self.dead_after = dead_after
        self.give_up_after = give_up_after
        self.clock = clock
        self._stream: FollowChannel | None = None
        self.reconnects = 0

    def close(self) -> None:
        if self._stream is not None:
            try:
                self._stream.close()
            except Exception:  # the connection may already be gone
                pass
            self._stream = None

    def _open(self) -> None:
        self._stream = self.door.follow(self.run_id, self.session, self.offset, self.inode, self.tail, self.once,
                                         self.events_offset)
        self.tail = -1  # only the first open starts from the tail

    def __iter__(self) -> Iterator[FollowEvent]:
        down_since: float | None = None
        attempt = failed_starts = 0
        while True:
            try:
                if self._stream is None:
                    self._open()
                    if down_since is not None:
                        self.reconnects += 1
                        yield Reconnected(self.offset)
                        attempt = 0
                for event in self._pump():
                    # Back for real once a frame came: an open that succeeds while the follower dies
                    # at once (no python3 there) must not reset the give-up clock.
                    down_since, failed_starts = None, 0
                    yield event
                return
            except (ConnectError, OSError, EOFError, _Dead) as exc:
                self.close()
                if isinstance(exc, (HostKeyError, AuthError)):
                    raise
                if isinstance(exc, _Dead) and exc.closed and not exc.framed:
                    failed_starts += 1
                    if failed_starts >= 3:  # the follower itself fails on the target: reconnecting cannot help
                        raise RemoteError(
                            f"{self.door.label}: the log follower on the target exited with code {exc.code} "
                            f"before sending anything: {exc.noise or 'no output'}",
                            hint="the target needs python3 (gpuops' follower and watchdog run there)") from None
                now = self.clock()
                down_since = down_since if down_since is not None else now
                if now - down_since > self.give_up_after:
                    raise ConnectError(self.door.label, f"lost the connection and could not get it back in {self.give_up_after:g}s") from None
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
                    self.door.reconnect()
                except (HostKeyError, AuthError):
                    raise
                except GpuopsError as exc2:
                    if not isinstance(exc2, ConnectError):
                        raise

    def _container_gone(self) -> str | None:
        """`stopped` or `missing` when the target is a container that no longer runs, else None."""
        try:
            now = self.door.container_state()
        except GpuopsError:  # the host is unreachable: the reconnect loop deals with that
            return None
        return now if now in ("stopped", "missing") else None

    def _pump(self) -> Iterator[FollowEvent]:
        framed = False
        last = self.clock()
        assert self._stream is not None
        while True:
            frames = self._stream.read(0.5)
            now = self.clock()
            if frames is None:
                if now - last > self.dead_after:
                    raise _Dead(f"no word from {self.door.label} for {self.dead_after:g}s")
                continue
            if isinstance(frames, Closed):
                # An exit status means the connection is up and the follower itself ended (killed, or its
                # container stopped); none (-1 from paramiko) means the connection dropped.
                code = frames.code
                raise _Dead("the connection closed", closed=code is not None and code >= 0, code=code,
                            framed=framed, noise=frames.noise)
            last = now
            for event in frames:
                framed = True
                if isinstance(event, Data):
                    if event.offset != self.offset and self.inode == event.inode:
                        raise _Dead(f"offset mismatch: expected {self.offset}, got {event.offset}")
                    self.inode = event.inode
                    self.offset = event.offset + len(event.data)
                elif isinstance(event, WatchdogEvent):
                    self.events_offset = max(self.events_offset, event.end)
                elif isinstance(event, Reset):
                    self.offset, self.inode = 0, 0
                elif isinstance(event, Ended):
                    yield event
                    self.close()
                    return
                yield event


class _Dead(Exception):
    """The follower's stream stopped answering; `closed`: the remote command ended without its E frame."""

    def __init__(self, message: str, *, closed: bool = False, code: int | None = None, framed: bool = True,
                 noise: str = "") -> None:
        super().__init__(message)
        self.code, self.framed, self.noise = code, framed, noise
        self.closed = closed
