"""An SSH host where there is no `ssh` binary: one paramiko connection per host (its jump chain in chain.py), commands on raw channels, retries."""

from __future__ import annotations

import errno
import logging
import select
import socket
import threading
import time
from typing import Mapping

from gpuops.command import Cmd
from gpuops.errors import AuthError, CommandTimeout, ConnectError, GpuopsError, HostKeyError
from gpuops.targets import Host
from gpuops.transport.base import Result
from gpuops.transport.ssh._paramiko import paramiko
from gpuops.transport.ssh.connecting import Connecting, ConnectionLost
from gpuops.transport.ssh.paramiko_ssh.chain import _Connection
from gpuops.transport.ssh.plan import where as _where

# paramiko logs its transport thread's exceptions (a banner timeout, a reset) with their tracebacks;
# with logging unconfigured Python prints them on stderr. gpuops reports those failures itself.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

_TRANSIENT_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EPIPE}


def is_transient(exc: BaseException) -> bool:
    """Refused, reset, timed out: worth another try. Auth and host-key errors never are."""
    if isinstance(exc, (HostKeyError, AuthError, paramiko.AuthenticationException, paramiko.BadHostKeyException)):
        return False
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return True
    if isinstance(exc, (socket.timeout, TimeoutError, EOFError, ConnectionLost)):
        return True
    if isinstance(exc, OSError) and not isinstance(exc, socket.gaierror):
        return exc.errno in _TRANSIENT_ERRNOS or exc.errno is None
    if isinstance(exc, paramiko.SSHException):
        text = str(exc)
        return any(s in text for s in ("banner", "reset", "closed", "timed out", "No existing session"))
    return False


class SshStream:
    """A command on a raw channel, stderr merged into stdout."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self._chan = channel
        self._eof = False

    def read(self, timeout: float) -> bytes | None:
        if self._eof:
            return b""
        if not self._chan.recv_ready():
            ready, _, _ = select.select([self._chan], [], [], max(timeout, 0))
            if not ready and not self._chan.recv_ready():
                if self._chan.closed or self._chan.eof_received:
                    self._eof = True
                    return b""
                return None
        data = self._chan.recv(65536)
        if not data:
            self._eof = True
        return data

    def write(self, data: bytes) -> None:
        self._chan.sendall(data)

    def close_stdin(self) -> None:
        try:
            self._chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def wait(self, timeout: float) -> int | None:
        if self._chan.status_event.wait(max(timeout, 0)):
            return self._chan.exit_status
        return None

    def connection_lost(self) -> bool:
        """The stream ended because the connection dropped (no exit status came), not because the command did."""
        transport = self._chan.get_transport()
        return self._chan.exit_status == -1 and (transport is None or not transport.is_active() or self._chan.closed)

    def close(self) -> None:
        self._chan.close()


class SshTransport(Connecting[_Connection]):
    """One SSH host through paramiko (where there is no `ssh` binary), connected lazily, once, and reused."""

    def __init__(self, host: Host, hosts: Mapping[str, Host], *, retry_time: float = 30.0) -> None:
        super().__init__(host, retry_time=retry_time)
        self.hosts = hosts

    # -- rendering -------------------------------------------------------------------

    def wrap(self, cmd: Cmd) -> Cmd:
        return cmd

    def render(self, cmd: Cmd, *, display: bool = True) -> str:
        return cmd.render(display=display)

    # -- connection ------------------------------------------------------------------

    def _active(self) -> bool:
        return self._conn is not None and self._conn.is_active()

    def _transient(self, exc: BaseException) -> bool:
        return is_transient(exc)

    def _failure(self, exc: BaseException) -> GpuopsError | None:
        if not isinstance(exc, (OSError, EOFError, paramiko.SSHException)):
            return None
        return ConnectError(
            self.label,
            f"cannot connect to {_where(self.host)}: {_describe_connect(exc, self.host.connect_timeout)}"
            f" (gave up after {self.retry_time:g}s of retries)",
            hint="check the address and port in the inventory, and that sshd is running",
        )

    def _connect_once(self) -> _Connection:
        return _Connection.open(self.host, self.hosts)

    def _transport(self) -> paramiko.Transport:
        self.connect()
        if self._conn is None or not self._conn.is_active():
            self.reconnect()
        assert self._conn is not None
        return self._conn.transport()

    # -- commands --------------------------------------------------------------------

    def _channel(self, cmd: Cmd, timeout: float) -> paramiko.Channel:
        transport = self._transport()
        self.commands += 1
        # paramiko's exec_command waits for the server's reply without a timeout: a peer that
        # goes silent right then would hang us, so a timer closes the connection instead.
        watchdog = threading.Timer(min(timeout, self.host.connect_timeout), transport.close)
        watchdog.daemon = True
        try:
            chan = transport.open_session(timeout=min(timeout, self.host.connect_timeout))
            watchdog.start()
            chan.exec_command(cmd.render())
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise ConnectionLost(self.label, f"connection lost ({_describe(exc)})") from None
        finally:
            watchdog.cancel()
        return chan

    def run(self, cmd: Cmd, *, timeout: float, stdin: bytes | None = None) -> Result:
        deadline = time.monotonic() + timeout
        chan = self._channel(cmd, timeout)
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            while True:
                while chan.recv_ready():
                    out.append(chan.recv(65536))
                while chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(65536))
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    if chan.eof_received or chan.closed:
                        break
                left = deadline - time.monotonic()
                if left <= 0:
                    self.close()
                    raise CommandTimeout(f"{self.label}: a remote command ran past {timeout:g}s; connection dropped")
                select.select([chan], [], [], min(left, 0.5))
            code = chan.recv_exit_status()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise ConnectionLost(self.label, f"connection lost ({_describe(exc)})") from None
        finally:
            chan.close()
        return Result(code, b"".join(out), b"".join(err))

    def open(self, cmd: Cmd) -> SshStream:
        chan = self._channel(cmd, self.host.connect_timeout)
        chan.set_combine_stderr(True)
        return SshStream(chan)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        # paramiko folds both "refused" and "no route to host" into this one error.
        unreachable = any(getattr(e, "errno", None) == errno.EHOSTUNREACH for e in exc.errors.values())
        return "no route to host (the host is down or unreachable)" if unreachable else "connection refused"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


def _describe_connect(exc: BaseException, timeout: float) -> str:
    """Why a connect attempt failed; paramiko's "No existing session" means the handshake never finished."""
    text = str(exc)
    if isinstance(exc, paramiko.SSHException) and any(s in text for s in ("No existing session", "Negotiation timed out")):
        return f"no SSH handshake within {timeout:g}s (the port accepts connections, but no SSH server answers there)"
    if isinstance(exc, paramiko.SSHException) and text.startswith("Error reading SSH protocol banner"):
        rest = text[len("Error reading SSH protocol banner"):].strip().splitlines()
        return f"no SSH banner ({rest[0]})" if rest else f"no SSH banner within {timeout:g}s"
    return _describe(exc)
