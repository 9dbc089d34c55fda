"""The chain of SSH connections to a host, connected hop by hop (planned in plan.py: each hop as ssh
resolves it), each hop's key and known_hosts files read before anything connects, each hop over a channel
of the one before (the first over the ProxyCommand's pipe when there is one)."""

from __future__ import annotations

import os
from typing import Any, Mapping

from gpuops.errors import AuthError, ConnectError, LockedKey
from gpuops.targets import Host
from gpuops.transport.ssh._paramiko import paramiko
from gpuops.transport.ssh.paramiko_ssh.hostkeys import HostKeyPolicy, bad_key_error, load_known_hosts
from gpuops.transport.ssh.paramiko_ssh.lowlatency import transport_factory
from gpuops.transport.ssh.plan import Hop, identity_file_path, plan_chain, where


class _Connection:
    """A connected SSHClient and the clients of its jump hosts (closed together)."""

    def __init__(self, clients: list[paramiko.SSHClient]) -> None:
        self.clients = clients  # jump hosts first, the target host last

    def transport(self) -> paramiko.Transport:
        transport = self.clients[-1].get_transport()
        assert transport is not None  # the host's client connected (open)
        return transport

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
            prepare(hop)  # a bad key or known_hosts file is said before any connection is made
        conn = cls([])
        try:
            for i, hop in enumerate(hops):
                sock = _tunnel(conn.clients[-1], hops[i - 1].host.name, hop) if i else proxy_sock(hop)
                conn.clients.append(hop.client)
                connect_hop(hop, sock)
        except BaseException:
            conn.close()
            raise
        conn.transport().set_keepalive(hops[-1].keepalive)
        return conn


def prepare(hop: Hop) -> None:
    """A client with this hop's known_hosts loaded and its key policy set: local work only."""
    if hop.host.identity_file:
        hop.keys = [identity_file_path(hop.host)]
    hop.client = paramiko.SSHClient()
    hop.revoked = load_known_hosts(hop.client, hop.known_hosts, hop.hostname, hop.port, label=hop.host.name)
    policy = HostKeyPolicy(hop.host.name, hop.policy, hop.known_hosts, hop.revoked)
    hop.client.set_missing_host_key_policy(policy)


def proxy_sock(hop: Hop) -> Any:
    """The ProxyCommand's pipe to this hop, as ssh runs it (None without one)."""
    return paramiko.ProxyCommand(hop.proxy_command) if hop.proxy_command else None


def connect_hop(hop: Hop, sock: Any) -> None:
    """Connect, over `sock` (the previous hop's channel) when there is one; host key checked, then auth."""
    timeout = hop.host.connect_timeout
    try:
        hop.client.connect(
            hop.hostname, port=hop.port, username=hop.user, key_filename=hop.keys or None, sock=sock,
            timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
            transport_factory=transport_factory,  # no 40 ms Nagle/delayed-ACK stalls (lowlatency.py)
        )
    except paramiko.BadHostKeyException as exc:
        raise bad_key_error(hop.host.name, exc, hop.known_hosts, hop.port, hop.revoked) from None
    except paramiko.AuthenticationException as exc:
        raise _auth_error(hop, exc) from None


def _tunnel(client: Any, via: str, hop: Hop) -> Any:
    """A direct-tcpip channel from the previous hop to this one: the socket this hop's SSH runs over."""
    try:
        return client.get_transport().open_channel(
            "direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0), timeout=hop.host.connect_timeout
        )
    except paramiko.ChannelException as exc:
        where = f"{hop.hostname}:{hop.port}"
        raise ConnectError(hop.host.name, f"jump host {via} could not reach {where} ({exc.text})") from None


def _auth_error(hop: Hop, exc: Exception) -> AuthError:
    """A refused login; when a key needs a passphrase that nothing supplied, say that instead."""
    host = hop.host
    locked = [k for k in hop.keys if _needs_passphrase(k)]
    if locked:
        return LockedKey(host.name, locked[0], bool(os.environ.get("SSH_AUTH_SOCK")))
    if host.identity_file:
        hint = f"check that {host.identity_file} is authorised for {host.user or 'the user'} on {where(host)}"
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
