"""An SSH host: one paramiko connection per host (jump hosts chained), commands on raw channels."""

from __future__ import annotations

import errno
import getpass
import logging
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from gpuops.transport._paramiko import paramiko

from gpuops.command import Cmd
from gpuops.config.model import Host
from gpuops.errors import AuthError, CommandTimeout, ConnectError, GpuopsError, HostKeyError, SshFileError, UsageError
from gpuops.transport.base import Result
from gpuops.transport.hostkeys import HostKeyPolicy, bad_key_error, load_known_hosts, os_reason
from gpuops.transport.lowlatency import transport_factory

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
        self.commands = 0

    # -- rendering -------------------------------------------------------------------

    def wrap(self, cmd: Cmd) -> Cmd:
        return cmd

    def render(self, cmd: Cmd, *, display: bool = True) -> str:
        return cmd.render(display=display)

    # -- connection ------------------------------------------------------------------

    def connect(self) -> None:
        with self._lock:
            if self._conn is not None and self._conn.is_active():
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


class _Connection:
    """A connected SSHClient and the clients of its jump hosts (closed together)."""

    def __init__(self, clients: list[Any]) -> None:
        self.clients = clients  # jump hosts first, the target host last

    def transport(self) -> paramiko.Transport:
        return self.clients[-1].get_transport()

    def is_active(self) -> bool:
        transport = self.clients[-1].get_transport()
        return transport is not None and transport.is_active()

    def close(self) -> None:
        for client in reversed(self.clients):
            client.close()

    @classmethod
    def open(cls, host: Host, hosts: Mapping[str, Host]) -> "_Connection":
        """Resolve the chain through ~/.ssh/config, read every hop's local files, then connect hop by hop."""
        hops = _plan(host, hosts, _ssh_config(), ())
        for hop in hops:
            hop.prepare()  # a bad key or known_hosts file is said before any connection is made
        conn = cls([])
        try:
            for i, hop in enumerate(hops):
                sock = _tunnel(conn.clients[-1], hops[i - 1].host.name, hop) if i else None
                conn.clients.append(hop.client)
                hop.connect(sock)
        except BaseException:
            conn.close()
            raise
        conn.transport().set_keepalive(15)
        return conn


def _ssh_config() -> Any:
    """~/.ssh/config, read as bytes as OpenSSH reads it (a comment in any encoding is no internal error)."""
    path = os.path.expanduser("~/.ssh/config")
    if not os.path.isfile(path):
        return paramiko.SSHConfig()
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise SshFileError(path, f"cannot be read ({os_reason(exc)})",
                           hint="make it readable for the user gpuops runs as, or move it away") from None
    return paramiko.SSHConfig.from_text(text)


def _user_known_hosts(cfg: Any) -> str:
    """The host's known_hosts file as OpenSSH picks it: ~/.ssh/config's UserKnownHostsFile (its
    first file), else ~/.ssh/known_hosts."""
    files = str(cfg.get("userknownhostsfile", "")).split()
    return files[0] if files else "~/.ssh/known_hosts"


def _where(host: Host) -> str:
    address = host.address or host.name
    return f"{address}:{host.port}" if host.port else address


@dataclass
class _Hop:
    """One SSH connection of a chain, resolved through ~/.ssh/config before anything connects."""

    host: Host
    hostname: str
    port: int
    user: str
    keys: list[str]
    known_hosts: str
    client: Any = None
    revoked: frozenset[str] = frozenset()

    def prepare(self) -> None:
        """A client with this hop's known_hosts loaded and its key policy set: local work only."""
        self.client = paramiko.SSHClient()
        self.revoked = load_known_hosts(self.client, self.known_hosts, self.hostname, self.port, label=self.host.name)
        policy = HostKeyPolicy(self.host.name, self.host.host_key_policy, self.known_hosts, self.revoked)
        self.client.set_missing_host_key_policy(policy)

    def connect(self, sock: Any) -> None:
        """Connect, over `sock` (the previous hop's channel) when there is one; host key checked, then auth."""
        timeout = self.host.connect_timeout
        try:
            self.client.connect(
                self.hostname, port=self.port, username=self.user, key_filename=self.keys or None, sock=sock,
                timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
                transport_factory=transport_factory,  # no 40 ms Nagle/delayed-ACK stalls (lowlatency.py)
            )
        except paramiko.BadHostKeyException as exc:
            raise bad_key_error(self.host.name, exc, self.known_hosts, self.port, self.revoked) from None
        except paramiko.AuthenticationException as exc:
            raise _auth_error(self, exc) from None


def _plan(host: Host, hosts: Mapping[str, Host], config: Any, seen: tuple[str, ...]) -> list[_Hop]:
    """The hops to connect, first to last, `host` last: its inventory `jump`'s own chain, else every host of
    ~/.ssh/config's ProxyJump in order (OpenSSH's `a,b`: a, then b through a, then `host` through b)."""
    cfg = config.lookup(host.address or host.name)
    if host.jump:
        before = _plan(hosts[host.jump], hosts, config, seen + (host.name,))
    elif seen:
        before = []  # a jump host's own ProxyJump is not followed
    else:
        before = [_resolve(hop, config.lookup(hop.address)) for hop in _proxy_jump(host, cfg)]
    return before + [_resolve(host, cfg)]


def _proxy_jump(host: Host, cfg: Any) -> list[Host]:
    """The hosts of a ProxyJump list (`[user@]host[:port]`, comma-separated); they check host keys as `host` does."""
    spec = str(cfg.get("proxyjump", "")).strip()
    if spec.lower() in ("", "none"):
        return []
    hops = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        user, _, rest = (part[len("ssh://"):] if part.startswith("ssh://") else part).rpartition("@")
        name, _, port = rest[1:].partition("]") if rest.startswith("[") else rest.partition(":")
        port = port.lstrip(":")
        if port and not port.isdigit():
            raise UsageError(f"~/.ssh/config: ProxyJump {spec}: {part!r} has a port that is not a number")
        hops.append(Host(name=name, address=name, user=user or None, port=int(port) if port else None,
                         known_hosts=host.known_hosts, host_key_policy=host.host_key_policy,
                         connect_timeout=host.connect_timeout))
    return hops


def _resolve(host: Host, cfg: Any) -> _Hop:
    """Where one hop really is and how to log in there: the inventory first, then ~/.ssh/config."""
    alias = host.address or host.name
    if host.identity_file:
        keys = [_identity_file(host)]
    else:  # OpenSSH skips a configured IdentityFile that does not exist
        keys = [k for k in (os.path.expanduser(k) for k in cfg.get("identityfile", [])) if os.path.exists(k)]
    return _Hop(host, cfg.get("hostname", alias), host.port or int(cfg.get("port", 22)),
                host.user or cfg.get("user") or getpass.getuser(), keys, host.known_hosts or _user_known_hosts(cfg))


def _identity_file(host: Host) -> str:
    """The inventory's identity_file, expanded; one that cannot be read is said now, not as a failed login."""
    path = os.path.expanduser(str(host.identity_file))
    try:
        with open(path, "rb"):
            return path
    except (FileNotFoundError, NotADirectoryError):
        problem = "does not exist"
    except IsADirectoryError:
        problem = "is a directory, expected a private key file"
    except OSError as exc:
        raise SshFileError(host.name, f"identity_file {host.identity_file} is not readable ({os_reason(exc)})",
                           hint=f"gpuops runs as {getpass.getuser()}: that user must be able to read the key "
                                "(its owner, mode 600)") from None
    raise SshFileError(host.name, f"identity_file {host.identity_file} {problem}",
                       hint=f"fix hosts.{host.name}.identity_file in the inventory (here it means {path}), "
                            "or leave it out to use ssh-agent and ~/.ssh/config keys")


def _tunnel(client: Any, via: str, hop: _Hop) -> Any:
    """A direct-tcpip channel from the previous hop to this one: the socket this hop's SSH runs over."""
    try:
        return client.get_transport().open_channel(
            "direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0), timeout=hop.host.connect_timeout
        )
    except paramiko.ChannelException as exc:
        where = f"{hop.hostname}:{hop.port}"
        raise ConnectError(hop.host.name, f"jump host {via} could not reach {where} ({exc.text})") from None


def _auth_error(hop: _Hop, exc: Exception) -> AuthError:
    """A refused login; when a key needs a passphrase that nothing supplied, say that instead."""
    host = hop.host
    locked = [k for k in hop.keys if _needs_passphrase(k)]
    if locked:
        agent = ("ssh-agent offered no key the host accepts" if os.environ.get("SSH_AUTH_SOCK")
                 else "no ssh-agent is running (SSH_AUTH_SOCK is not set)")
        return AuthError(host.name, f"the key {locked[0]} needs a passphrase and {agent}; gpuops never prompts for one",
                         hint=f"load it into the agent gpuops can reach (`ssh-add {locked[0]}`), "
                              "or use a key without a passphrase")
    if host.identity_file:
        hint = f"check that {host.identity_file} is authorised for {host.user or 'the user'} on {_where(host)}"
    else:
        hint = "set identity_file in the inventory, load a key into ssh-agent, or configure IdentityFile in ~/.ssh/config"
    return AuthError(host.name, f"authentication failed ({exc})", hint=hint)


def _needs_passphrase(path: str) -> bool:
    """Whether a private key file is encrypted (paramiko says so for each key type it tries)."""
    for key_class in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            key_class.from_private_key_file(path)
            return False
        except paramiko.PasswordRequiredException:
            return True
        except (OSError, ValueError, paramiko.SSHException):
            continue
    return False
