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


class Container(Protocol):
    """What only a container target can answer (the pct transport): its state, pct's words read, and the host it
    runs on (whose kernel logs the container's GPU errors: docs/health.md)."""

    ctid: int

    @property
    def host(self) -> "Transport":
        """The Proxmox host's own transport (what `pct` runs on): where the host's tools run."""

    def from_host(self, cmd: Cmd) -> Cmd:
        """cmd as the host runs it in the container (`pct exec CTID -- ...`, as the target's user)."""

    def run_with_state(self, cmd: Cmd, *, timeout: float, stdin: bytes | None = None) -> tuple[Result, str]:
        """Run cmd and learn the container's state in the same round trip: (result, `running`) when it
        ran there, else what `pct status` said then."""

    def container_state(self, *, timeout: float) -> str:
        """The container's state (`running`, `stopped`, `missing`, or pct's own words)."""

    def raise_for_container(self, output: str) -> None:
        """Raise ContainerNotRunning when output is pct saying the container is missing or stopped."""


class Transport(Protocol):
    """How commands reach a target; implementations wrap one another (pct wraps ssh).

    Everything a caller needs is here, container or not: `container` is the container's own
    questions where the target is one, and None on a host (HostSide), so no caller asks which
    kind of transport it holds."""

    label: str

    @property
    def container(self) -> Container | None:
        """The container's own questions where the target is one; None on a host."""

    @property
    def connections_made(self) -> int:
        """SSH connections made so far (0 for this machine): what -v reports."""

    @property
    def commands(self) -> int:
        """Commands sent so far (round trips): what -v reports."""

    @property
    def command_timeout(self) -> float:
        """Seconds for one short command, from the host's `command_timeout`."""

    def wrap(self, cmd: Cmd) -> Cmd:
        """The command as handed to the innermost executor (pct adds `pct exec N --`)."""

    def render(self, cmd: Cmd, *, display: bool = True) -> str:
        """Exactly what would be sent, for --dry-run; secrets masked when display."""

    def run(self, cmd: Cmd, *, timeout: float, stdin: bytes | None = None) -> Result:
        """Run to completion; raises CommandTimeout past timeout, ConnectError if unreachable."""

    def open(self, cmd: Cmd) -> Stream:
        """Start a command and return its live output stream."""

    def connect_soon(self) -> None:
        """Start connecting in the background (a no-op where there is nothing to connect): the next
        connect() adopts that connection, or raises its error, as if it had made the attempt itself."""

    def connect(self) -> None:
        """Make sure the connection is up (retrying transient failures)."""

    def reconnect(self) -> None:
        """Drop the current connection and make a new one."""

    def close(self) -> None: ...


class HostSide:
    """A transport to a host: it is no container, so it has no container questions to answer."""

    container: Container | None = None


class Wrapping:
    """A transport that wraps another (pct, become): its connection, counters and timeout are the inner's."""

    inner: Transport

    @property
    def connections_made(self) -> int:
        return self.inner.connections_made

    @property
    def commands(self) -> int:
        return self.inner.commands

    @property
    def command_timeout(self) -> float:
        return self.inner.command_timeout

    def connect_soon(self) -> None:
        self.inner.connect_soon()

    def connect(self) -> None:
        self.inner.connect()

    def reconnect(self) -> None:
        self.inner.reconnect()

    def close(self) -> None:
        self.inner.close()
