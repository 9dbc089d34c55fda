"""The one interface every target is reached through: run a command, or open a stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpuops.command import Cmd


@dataclass(frozen=True)
class Result:
    """A finished command: its exit code and both output streams."""

    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")


class Stream(Protocol):
    """A running command: stdout and stderr merged, stdin writable, killable by closing."""

    def read(self, timeout: float) -> bytes | None:
        """Up to 64 KiB of output; b"" at end of output; None if nothing came within timeout."""

    def write(self, data: bytes) -> None: ...

    def close_stdin(self) -> None: ...

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if the command did not end within timeout."""

    def connection_lost(self) -> bool:
        """Whether the stream ended because its connection dropped (not because the command ended)."""

    def close(self) -> None:
        """Drop the stream; the remote command may live on (stop it explicitly)."""


class Transport(Protocol):
    """How commands reach a target; implementations wrap one another (pct wraps ssh)."""

    label: str

    def wrap(self, cmd: Cmd) -> Cmd:
        """The command as handed to the innermost executor (pct adds `pct exec N --`)."""

    def render(self, cmd: Cmd, *, display: bool = True) -> str:
        """Exactly what would be sent, for --dry-run; secrets masked when display."""

    def run(self, cmd: Cmd, *, timeout: float, stdin: bytes | None = None) -> Result:
        """Run to completion; raises CommandTimeout past timeout, ConnectError if unreachable."""

    def open(self, cmd: Cmd) -> Stream:
        """Start a command and return its live output stream."""

    def connect(self) -> None:
        """Make sure the connection is up (retrying transient failures)."""

    def reconnect(self) -> None:
        """Drop the current connection and make a new one."""

    def close(self) -> None: ...
