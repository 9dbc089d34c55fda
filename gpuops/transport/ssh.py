"""An SSH host: one fabric connection per host, commands on raw paramiko channels."""

from __future__ import annotations

import errno
import os
import select
import socket
import threading
import time
from typing import Any, Mapping

import paramiko

from gpuops.command import Cmd
from gpuops.config.model import Host
from gpuops.errors import AuthError, CommandTimeout, ConnectError, GpuopsError, HostKeyError
from gpuops.transport.base import Result
from gpuops.transport.hostkeys import HostKeyPolicy, changed_key_error, load_known_hosts

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

    def close(self) -> None:
        self._chan.close()


class SshTransport:
    """One SSH host, connected lazily, once, and reused for every command."""

    def __init__(self, host: Host, hosts: Mapping[str, Host], *, retry_time: float = 30.0) -> None:
        self.host = host
        self.hosts = hosts
        self.label = host.name
        self.retry_time = retry_time
        self._conn: Any = None
        self._lock = threading.Lock()
        self.connections_made = 0

    # -- rendering -------------------------------------------------------------------

    def wrap(self, cmd: Cmd) -> Cmd:
        return cmd

    def render(self, cmd: Cmd, *, display: bool = True) -> str:
        return cmd.render(display=display)

    # -- connection ------------------------------------------------------------------

    def connect(self) -> None:
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                return
            self._drop()
            self._conn = self._connect_with_retries()

    def reconnect(self) -> None:
        with self._lock:
            self._drop()
            self._conn = self._connect_with_retries()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # closing a dead connection may raise anything; it is gone either way
                pass
            self._conn = None

    def _connect_with_retries(self) -> Any:
        from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

        retrying = Retrying(
            stop=stop_after_delay(self.retry_time),
            wait=wait_exponential_jitter(initial=0.25, max=4.0, jitter=0.5),
            retry=retry_if_exception(is_transient),
            reraise=True,
        )
        try:
            return retrying(self._connect_once)
        except GpuopsError:
            raise
        except paramiko.AuthenticationException as exc:
            raise AuthError(self.label, f"authentication failed ({exc})", hint=self._auth_hint()) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectError(
                self.label,
                f"cannot connect to {self._where()}: {_describe(exc)} (gave up after {self.retry_time:g}s of retries)",
                hint="check the address and port in the inventory, and that sshd is running",
            ) from None

    def _connect_once(self) -> Any:
        conn = self._build(self.host, ())
        try:
            conn.open()
        except paramiko.BadHostKeyException as exc:
            raise changed_key_error(self._key_owner(conn, exc), exc, self._known_hosts_of(conn, exc)) from None
        except BaseException:
            try:
                conn.close()
            except Exception:  # the half-open connection is discarded either way
                pass
            raise
        transport = conn.client.get_transport()
        transport.set_keepalive(15)
        self.connections_made += 1
        return conn

    def _build(self, host: Host, seen: tuple[str, ...]) -> Any:
        """A fabric Connection (and its gateways), with our host-key policy on every hop."""
        from fabric import Config, Connection

        gateway: Any = None
        if host.jump:
            gateway = self._build(self.hosts[host.jump], seen + (host.name,))
        kwargs: dict[str, Any] = {
            "banner_timeout": host.connect_timeout,
            "auth_timeout": host.connect_timeout,
            "channel_timeout": host.connect_timeout,
        }
        if host.identity_file:
            kwargs["key_filename"] = [os.path.expanduser(host.identity_file)]
        conn = Connection(
            host=host.address or host.name,
            user=host.user,
            port=host.port,
            config=Config(),
            connect_timeout=host.connect_timeout,
            connect_kwargs=kwargs,
            gateway=gateway,
        )
        hop: Any = conn
        while hop is not None and not isinstance(hop, str):
            owner = host if hop is conn else _host_for(hop, self.hosts, host)
            hop.client.set_missing_host_key_policy(HostKeyPolicy(owner.name, owner.host_key_policy, owner.known_hosts))
            load_known_hosts(hop.client, owner.known_hosts)
            hop._gpuops_host = owner
            hop = hop.gateway
        return conn

    def _key_owner(self, conn: Any, exc: Any) -> str:
        return self._hop_for(conn, exc).name

    def _known_hosts_of(self, conn: Any, exc: Any) -> str:
        return self._hop_for(conn, exc).known_hosts

    def _hop_for(self, conn: Any, exc: Any) -> Host:
        hop = conn
        while hop is not None and not isinstance(hop, str):
            if hop.host == exc.hostname or exc.hostname.startswith(f"[{hop.host}]"):
                return hop._gpuops_host
            hop = hop.gateway
        return self.host

    def _where(self) -> str:
        address = self.host.address or self.host.name
        return f"{address}:{self.host.port}" if self.host.port else address

    def _auth_hint(self) -> str:
        if self.host.identity_file:
            return f"check that {self.host.identity_file} is authorised for {self.host.user or 'the user'} on {self._where()}"
        return "set identity_file in the inventory, load a key into ssh-agent, or configure IdentityFile in ~/.ssh/config"

    def _transport(self) -> paramiko.Transport:
        self.connect()
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            self.reconnect()
            transport = self._conn.client.get_transport()
        return transport

    # -- commands --------------------------------------------------------------------

    def _channel(self, cmd: Cmd, timeout: float) -> paramiko.Channel:
        transport = self._transport()
        try:
            chan = transport.open_session(timeout=min(timeout, self.host.connect_timeout))
            chan.exec_command(cmd.render())
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise ConnectionLost(self.label, f"connection lost ({_describe(exc)})") from None
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


def _host_for(hop: Any, hosts: Mapping[str, Host], fallback: Host) -> Host:
    """The inventory host a fabric gateway stands for (ssh_config ProxyJump hops get defaults)."""
    for h in hosts.values():
        if (h.address or h.name) == hop.host:
            return h
    return Host(name=hop.host, known_hosts=fallback.known_hosts, host_key_policy=fallback.host_key_policy)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return "connection refused"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]
