"""The agent's streaming tools, held open: the launch lock (heartbeats in, its verdict out), a warmup
(its output lines) and the follower (its frames). Each reads its tool's bytes through agent/wire and
hands typed replies on; what a stream sends back (a heartbeat, `release`) is written here too."""

from __future__ import annotations

from dataclasses import dataclass

from gpuops.agent.wire import marks
from gpuops.agent.wire import protocol as p
from gpuops.errors import RemoteError, TargetNotReady
from gpuops.transport.base import Stream, Transport


class LockChannel:
    """lock.sh, held: the lock stays the launcher's while heartbeats keep coming on its stdin."""

    def __init__(self, stream: Stream, transport: Transport, label: str) -> None:
        self._stream: Stream | None = stream
        self._transport = transport
        self._label = label

    def wait_locked(self, timeout: float) -> marks.LockReply:
        """lock.sh's verdict (with the probe taken under the locks), once it holds them or refused; raise when it
        could not take them at all."""
        return marks.parse_lock(self._read_until_locked(timeout))

    def _read_until_locked(self, timeout: float) -> str:
        assert self._stream is not None
        buf = b""
        while marks.LOCKED_OK_LINE not in buf:
            chunk = self._stream.read(timeout)
            if chunk is None or chunk == b"":
                code = self._stream.wait(5.0)
                self.close()
                text = buf.decode("utf-8", "replace")
                if marks.parse_lock(text).refused:
                    return text
                if self._transport.container is not None:
                    self._transport.container.raise_for_container(text)
                if code == marks.CANNOT_CREATE_EXIT:  # no run could be recorded there
                    raise TargetNotReady(f"{self._label}: cannot create gpuops' folders under ~/.gpuops on the "
                                         f"target: {text.strip()[-300:]}", hint="the target user's home must be writable")
                raise RemoteError(
                    f"{self._label}: could not take the launch lock (exit {code}): {text.strip()[-400:] or 'no output'}",
                    hint="the target needs bash, flock (util-linux) and a writable home directory",
                )
            buf += chunk
        return buf.decode("utf-8", "replace")

    def beat(self) -> None:
        """One heartbeat: the launcher is alive."""
        if self._stream is not None:
            self._stream.write(b"\n")

    def release(self) -> bool:
        """Give the locks back; True when the connection was lost on the way (its holder name may linger)."""
        if self._stream is None:
            return False
        lost = False
        try:
            self._stream.write(b"release\n")  # else the target takes us for a launcher that died
            self._stream.close_stdin()
            self._stream.wait(5.0)
            lost = self._stream.connection_lost()
        except Exception:  # releasing over a dead connection: the target frees the lock by itself
            lost = True
        self.close()
        return lost

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


class WarmupChannel:
    """warmup.sh, running: its output line by line, every line the warmup's own (whether `gpuops stop` ended
    it is read from the run's abort record, never from what the warmup printed or its exit status)."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._pending = b""
        self.ended = False  # its output is over (wait() gives its exit code)

    def lines(self, timeout: float) -> list[str] | None:
        """The whole lines that came within timeout (None: nothing came)."""
        chunk = self._stream.read(timeout)
        if chunk is None:
            return None
        if chunk == b"":
            self.ended = True
            return []
        self._pending += chunk
        *lines, self._pending = self._pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        return [raw.decode("utf-8", "replace") for raw in lines]

    def rest(self) -> str | None:
        """A last line without its newline, if any."""
        return self._pending.decode("utf-8", "replace") if self._pending else None

    def wait(self, timeout: float) -> int | None:
        return self._stream.wait(timeout)

    def connection_lost(self) -> bool:
        return self._stream.connection_lost()

    def close(self) -> None:
        self._stream.close()


@dataclass
class Closed:
    """The follower's stream ended: `code` its exit status (None or < 0: the connection dropped)."""

    code: int | None
    noise: str


class FollowChannel:
    """The follower, running: its frames as typed replies."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._reader = p.FrameReader()

    def read(self, timeout: float) -> list[p.Frame] | Closed | None:
        """The frames that came within timeout; None: nothing came; Closed: the stream ended."""
        chunk = self._stream.read(timeout)
        if chunk is None:
            return None
        if chunk == b"":
            return Closed(self._stream.wait(2.0), self._reader.noise)
        return self._reader.feed(chunk)

    def close(self) -> None:
        self._stream.close()


