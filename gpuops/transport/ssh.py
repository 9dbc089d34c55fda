"""An SSH host: one paramiko connection per host (its jump chain in sshchain.py), commands on raw channels, retries."""

from __future__ import annotations

import errno
import logging
import select
import socket
import threading
import time
from typing import Any, Mapping

from gpuops.transport._paramiko import paramiko

from gpuops.command import Cmd
from gpuops.config.model import Host
from gpuops.errors import AuthError, CommandTimeout, ConnectError, GpuopsError, HostKeyError
from gpuops.transport.base import HostSide, Result
from gpuops.transport.head_start import Early
from gpuops.transport.sshchain import _Connection
from gpuops.transport.sshplan import where as _where

# paramiko logs its transport thread's exceptions (a banner timeout, a reset) with their tracebacks;
# with logging unconfigured Python prints them on stderr. gpuops reports those failures itself.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

_TRANSIENT_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EPIPE}


class ConnectionLost(ConnectError):
    """The connection dropped while a command was running."""


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


class SshTransport(HostSide):
    """One SSH host, connected lazily, once, and reused for every command."""

    def __init__(self, host: Host, hosts: Mapping[str, Host], *, retry_time: float = 30.0) -> None:
        self.host = host
        self.hosts = hosts
        self.label = host.name
        self.retry_time = retry_time
        self._conn: Any = None
        self._early: Early | None = None
        self._lock = threading.Lock()
        self.connections_made = 0
        self.commands = 0

    @property
    def command_timeout(self) -> float:
        return self.host.command_timeout

    # -- rendering -------------------------------------------------------------------

    def wrap(self, cmd: Cmd) -> Cmd:
        return cmd

    def render(self, cmd: Cmd, *, display: bool = True) -> str:
        return cmd.render(display=display)

    # -- connection ------------------------------------------------------------------

    # Every attempt runs in its own thread (transport/early.py) and callers wait for it without holding
    # the lock: Ctrl-C ends a wait at once, close() never waits for a handshake (a silent host held it
    # for its whole connect timeout), and threads asking for one host share one attempt.

    def connect_soon(self) -> None:
        with self._lock:
            if self._early is None and not self._active():
                self._start_locked()

    def connect(self) -> None:
        with self._lock:
            if self._early is None:
                if self._active():
                    return
                self._start_locked()
            early = self._early
        self._adopt(early)

    def reconnect(self) -> None:
        with self._lock:
            self._start_locked()
            early = self._early
        self._adopt(early)

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _active(self) -> bool:
        return self._conn is not None and self._conn.is_active()

    def _start_locked(self) -> None:
        """A new attempt in its thread; the connection there (or an attempt under way) is dropped first."""
        self._drop()
        self._early = Early(self._connect_with_retries, close=lambda conn: conn.close())

    def _adopt(self, early: Early) -> None:
        """Wait for the attempt; its connection becomes this host's, its error is raised (once: the next
        connect() makes a new attempt)."""
        try:
            conn = early.result()
        except BaseException as exc:
            with self._lock:
                if self._early is early:
                    self._early = None
            if not isinstance(exc, Exception):  # Ctrl-C while it connects: its connection is closed when made
                early.discard()
            raise
        with self._lock:
            if self._early is early:
                self._early, self._conn = None, conn
            elif conn is None or self._conn is not conn:  # closed while it connected: nothing to adopt
                raise ConnectionLost(self.label, "the connection was closed while it was being made")

    def _drop(self) -> None:
        if self._early is not None:
            self._early.discard()
            self._early = None
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # closing a dead connection may raise anything; it is gone either way
                pass
            self._conn = None

    def _connect_with_retries(self) -> Any:
        started = time.monotonic()
        try:
            try:
                conn = self._connect_once()
            except Exception as exc:
                if not is_transient(exc) or self.retry_time <= 0:
                    raise
                # tenacity is imported here, on the first failure, not on every start-up (10-15 ms).
                conn = self._retry(self.retry_time - (time.monotonic() - started))
        except GpuopsError:
            raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectError(
                self.label,
                f"cannot connect to {_where(self.host)}: {_describe_connect(exc, self.host.connect_timeout)}"
                f" (gave up after {self.retry_time:g}s of retries)",
                hint="check the address and port in the inventory, and that sshd is running",
            ) from None
        self.connections_made += 1
        return conn

    def _retry(self, budget: float) -> Any:
        """The attempts after a first transient failure: exponential backoff with jitter
        (0.25 s, 0.5 s, 1 s ... at most 4 s), never sleeping past the budget left."""
        import random

        from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential, wait_random

        first_wait = max(0.0, min(0.25 + random.uniform(0, 0.25), budget))
        time.sleep(first_wait)
        budget -= first_wait
        backoff = wait_exponential(multiplier=0.5, max=4.0) + wait_random(0, 0.25)

        def wait(state: Any) -> float:
            # The last attempt starts when the budget ends.
            return max(0.0, min(backoff(state), budget - state.seconds_since_start))

        retrying = Retrying(stop=stop_after_delay(max(0.0, budget)), wait=wait,
                            retry=retry_if_exception(is_transient), reraise=True)
        return retrying(self._connect_once)

    def _connect_once(self) -> Any:
        return _Connection.open(self.host, self.hosts)

    def _transport(self) -> paramiko.Transport:
        self.connect()
        if not self._conn.is_active():
            self.reconnect()
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
