"""The chain of SSH connections to a host: hops planned through the inventory and ~/.ssh/config
(its `jump`, else ProxyJump), each hop's key and known_hosts files read before anything connects,
then connected hop by hop, each over a channel of the one before."""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from typing import Any, Mapping

from gpuops.transport._paramiko import paramiko

from gpuops.config.model import Host
from gpuops.errors import AuthError, ConnectError, SshFileError, UsageError
from gpuops.transport.hostkeys import HostKeyPolicy, bad_key_error, load_known_hosts, os_reason
from gpuops.transport.lowlatency import transport_factory


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
