"""The chain of SSH connections to a host: hops planned through the inventory and ssh's own resolution
(sshresolve: `ssh -G`; the inventory's `jump`, else ProxyJump, else a ProxyCommand), each hop's key and
known_hosts files read before anything connects, then connected hop by hop, each over a channel of the
one before (the first over the ProxyCommand's pipe when there is one)."""

from __future__ import annotations

import getpass
import os
import shlex
from dataclasses import dataclass
from typing import Any, Mapping

from gpuops.transport._paramiko import paramiko

from gpuops.config.model import Host
from gpuops.errors import AuthError, ConnectError, SshFileError, UsageError, os_reason
from gpuops.transport.hostkeys import HostKeyPolicy, bad_key_error, load_known_hosts
from gpuops.transport.lowlatency import transport_factory
from gpuops.transport.sshresolve import Resolved, explicit_args, resolve


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
        """Resolve the chain as ssh does (`ssh -G`), read every hop's local files, then connect hop by hop."""
        hops = plan_chain(host, hosts)
        for hop in hops:
            hop.prepare()  # a bad key or known_hosts file is said before any connection is made
        conn = cls([])
        try:
            for i, hop in enumerate(hops):
                sock = _tunnel(conn.clients[-1], hops[i - 1].host.name, hop) if i else hop.proxy_sock()
                conn.clients.append(hop.client)
                hop.connect(sock)
        except BaseException:
            conn.close()
            raise
        conn.transport().set_keepalive(hops[-1].keepalive)
        return conn


def _where(host: Host) -> str:
    address = host.address or host.name
    return f"{address}:{host.port}" if host.port else address


@dataclass
class _Hop:
    """One SSH connection of a chain, resolved as ssh resolves it before anything connects."""

    host: Host
    hostname: str
    port: int
    user: str
    keys: list[str]
    known_hosts: str
    policy: str = "strict"
    proxy_command: str = ""  # run for this hop's socket (the first hop only), %-tokens expanded
    keepalive: int = 15
    client: Any = None
    revoked: frozenset[str] = frozenset()

    def spelled(self) -> str:
        """user@host:port, as validate --json and the dry-run header show a hop."""
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{self.user}@{host}:{self.port}"

    def prepare(self) -> None:
        """A client with this hop's known_hosts loaded and its key policy set: local work only."""
        if self.host.identity_file:
            self.keys = [_identity_file(self.host)]
        self.client = paramiko.SSHClient()
        self.revoked = load_known_hosts(self.client, self.known_hosts, self.hostname, self.port, label=self.host.name)
        policy = HostKeyPolicy(self.host.name, self.policy, self.known_hosts, self.revoked)
        self.client.set_missing_host_key_policy(policy)

    def proxy_sock(self) -> Any:
        """The ProxyCommand's pipe to this hop, as ssh runs it (None without one)."""
        return paramiko.ProxyCommand(self.proxy_command) if self.proxy_command else None

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


def plan_chain(host: Host, hosts: Mapping[str, Host]) -> list[_Hop]:
    """The hops to connect, first to last, `host` last, as ssh resolves them (`ssh -G`: nothing connects)."""
    return _plan(host, hosts, ())


def _plan(host: Host, hosts: Mapping[str, Host], seen: tuple[str, ...]) -> list[_Hop]:
    """Its inventory `jump`'s own chain, else every host of ssh's ProxyJump in order (OpenSSH's `a,b`: a,
    then b through a, then `host` through b), else an `ssh -W %h:%p HOP` ProxyCommand as a hop."""
    found = resolve(host.address or host.name, explicit_args(host))
    if found.host_key_alias:
        raise UsageError(f"{host.name}: HostKeyAlias {found.host_key_alias} (ssh configuration) is not honoured by "
                         "gpuops", hint="remove it for this host, or name the host by that alias")
    command = ""
    if host.jump:
        before = _plan(hosts[host.jump], hosts, seen + (host.name,))
    elif seen:
        before = []  # a jump host's own ProxyJump is not followed
    elif found.proxy_jump:
        before = [_resolve(hop, resolve(hop.address or hop.name, explicit_args(hop)))
                  for hop in _proxy_jump(host, found.proxy_jump)]
    elif found.proxy_command:
        hop = ssh_w_hop(found.proxy_command, host)
        if hop is None:
            before, command = [], found.proxy_command
        else:
            before = [_resolve(hop, resolve(hop.address or hop.name, hop.ssh_args))]
    else:
        before = []
    last = _resolve(host, found)
    if command:
        last.proxy_command = _tokens(command, last, host.address or host.name)
    return before + [last]


def _tokens(command: str, hop: _Hop, alias: str) -> str:
    """ProxyCommand's %h %p %r %n %% as ssh expands them."""
    table = {"h": hop.hostname, "p": str(hop.port), "r": hop.user, "n": alias, "%": "%"}
    out, i = [], 0
    while i < len(command):
        if command[i] == "%" and i + 1 < len(command):
            if command[i + 1] not in table:
                raise UsageError(f"{hop.host.name}: ProxyCommand {command!r}: gpuops does not expand %{command[i + 1]}")
            out.append(table[command[i + 1]])
            i += 2
        else:
            out.append(command[i])
            i += 1
    return "".join(out)


_SSH_VALUED = set("BbcDEeFIiJLlmOopPQRSWw")  # ssh's options that take a value


def ssh_w_hop(command: str, host: Host) -> Host | None:
    """`ssh [OPTIONS] -W %h:%p [user@]DEST` as the jump host it is; None for any other ProxyCommand."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if not argv or os.path.basename(argv[0]) != "ssh":
        return None
    args: list[str] = []
    dests: list[str] = []
    forward = None
    i = 1
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("-") or arg == "-":
            dests.append(arg)
            continue
        if arg[1] in _SSH_VALUED:
            value = arg[2:]
            if not value and i < len(argv):
                value, i = argv[i], i + 1
            if arg[1] == "W":
                forward = value
            else:
                args += [arg[:2], value]
        else:
            args.append(arg)
    if forward != "%h:%p" or len(dests) != 1:
        return None
    user, _, name = dests[0].rpartition("@")
    extra = ("-o", f"User={user}") if user else ()
    return Host(name=name, address=name, ssh_args=(*extra, *args), known_hosts=host.known_hosts,
                host_key_policy=host.host_key_policy, connect_timeout=host.connect_timeout)


def _proxy_jump(host: Host, spec: str) -> list[Host]:
    """The hosts of a ProxyJump list (`[user@]host[:port]`, comma-separated); they check host keys as `host` does."""
    hops = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        user, _, rest = (part[len("ssh://"):] if part.startswith("ssh://") else part).rpartition("@")
        name, _, port = rest[1:].partition("]") if rest.startswith("[") else rest.partition(":")
        port = port.lstrip(":")
        if port and not port.isdigit():
            raise UsageError(f"{host.name}: ProxyJump {spec}: {part!r} has a port that is not a number")
        hops.append(Host(name=name, address=name, user=user or None, port=int(port) if port else None,
                         known_hosts=host.known_hosts, host_key_policy=host.host_key_policy,
                         connect_timeout=host.connect_timeout))
    return hops


def _resolve(host: Host, found: Resolved) -> _Hop:
    """Where one hop really is and how to log in there: the inventory first, then ssh's resolution."""
    if host.identity_file:
        keys = [os.path.expanduser(str(host.identity_file))]  # checked in prepare(), before connecting
    else:  # OpenSSH skips a configured IdentityFile that does not exist
        keys = [k for k in (os.path.expanduser(k) for k in found.identity_files) if os.path.exists(k)]
    policy = host.host_key_policy
    if policy is None:  # no/off are strict too: gpuops never skips the check
        policy = "accept-new" if found.strict == "accept-new" else "strict"
    return _Hop(host, found.hostname, host.port or found.port, host.user or found.user, keys,
                host.known_hosts or found.known_hosts, policy, keepalive=found.server_alive_interval or 15)


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
