"""The chain of SSH hops to a host, planned as ssh resolves it before anything connects (resolve.py: `ssh -G`;
the inventory's `jump`, else ProxyJump, else a ProxyCommand). No paramiko here: `validate` and the dry run
show the chain without importing it; chain.py connects it."""

from __future__ import annotations

import getpass
import os
import shlex
from dataclasses import dataclass
from typing import Any, Mapping

from gpuops.errors import SshFileError, UsageError, os_reason
from gpuops.targets import Host
from gpuops.transport.ssh.resolve import Resolved, explicit_args, resolve


def where(host: Host) -> str:
    address = host.address or host.name
    return f"{address}:{host.port}" if host.port else address


def known_hosts_name(hostname: str, port: int) -> str:
    """How known_hosts (and ssh's messages, and `ssh-keygen -R`) name a server: `[host]:port` off port 22."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def read_known_hosts(path: str, label: str) -> str | None:
    """The file's text (undecodable bytes kept as surrogates: they match no name), None when there is
    none; a directory or a file we may not read is the user's to fix, said before any connection."""
    try:
        with open(os.path.expanduser(path), "rb") as fh:
            return fh.read().decode("utf-8", "surrogateescape")
    except (FileNotFoundError, NotADirectoryError):
        return None  # as OpenSSH: no file, no known key (accept-new creates it)
    except IsADirectoryError:
        problem = "is a directory, expected a file"
    except OSError as exc:
        problem = f"is not readable ({os_reason(exc)})"
    raise SshFileError(label, f"known_hosts {path} {problem}", hint=(
        "set known_hosts in the inventory (or UserKnownHostsFile in ~/.ssh/config) to a file the user gpuops runs "
        "as can read; a file that does not exist yet is fine: no key is known"))


def identity_file_path(host: Host) -> str:
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


@dataclass
class Hop:
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
    cannot_record: str = ""  # accept-new, yet known_hosts cannot take a new key: why (then strict)

    def spelled(self) -> str:
        """user@host:port, as validate --json and the dry-run header show a hop."""
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{self.user}@{host}:{self.port}"


def plan_chain(host: Host, hosts: Mapping[str, Host]) -> list[Hop]:
    """The hops to connect, first to last, `host` last, as ssh resolves them (`ssh -G`: nothing connects)."""
    return _plan(host, hosts, ())


def _plan(host: Host, hosts: Mapping[str, Host], seen: tuple[str, ...]) -> list[Hop]:
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


def _tokens(command: str, hop: Hop, alias: str) -> str:
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


def _resolve(host: Host, found: Resolved) -> Hop:
    """Where one hop really is and how to log in there: the inventory first, then ssh's resolution."""
    if host.identity_file:
        keys = [os.path.expanduser(str(host.identity_file))]  # checked in prepare(), before connecting
    else:  # OpenSSH skips a configured IdentityFile that does not exist
        keys = [k for k in (os.path.expanduser(k) for k in found.identity_files) if os.path.exists(k)]
    policy = host.host_key_policy
    if policy is None:  # no/off are strict too: gpuops never skips the check
        policy = "accept-new" if found.strict == "accept-new" else "strict"
    return Hop(host, found.hostname, host.port or found.port, host.user or found.user, keys,
                host.known_hosts or found.known_hosts, policy, keepalive=found.server_alive_interval or 15)
