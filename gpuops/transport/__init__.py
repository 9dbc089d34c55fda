"""Transports: local, ssh, and pct wrapping either; one connection per host per invocation.

An SSH host is reached with the user's `ssh` binary (ssh/openssh/), or with paramiko where there is none
(ssh/paramiko_ssh/); the SSH family lives in ssh/, beside local.py, pct.py and become.py.
Each kind is imported when a host of that kind is first used (paramiko only without `ssh`), and `gpuops
status` starts connecting (Pool.connect_soon) before it imports what it does not
need for that."""

from __future__ import annotations

import math
import os
import threading
from typing import Any, Mapping

from gpuops.command import Cmd
from gpuops.errors import UsageError
from gpuops.targets import Host, Inventory, Target
from gpuops.transport.base import HostSide, Result, Stream, Transport

__all__ = ["Pool", "Result", "Stream", "Transport", "dry_transport"]

clients_used: set[str] = set()  # which SSH client carried the connections: what -v reports
RETRY_TIME = 30.0
RETRY_TIME_ENV = "GPUOPS_CONNECT_RETRY_TIME"


def retry_time_from_env() -> float:
    """Seconds to keep retrying transient connect failures: GPUOPS_CONNECT_RETRY_TIME, else 30 (CI budgets)."""
    text = os.environ.get(RETRY_TIME_ENV, "").strip()
    if not text:
        return RETRY_TIME
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise UsageError(f"{RETRY_TIME_ENV}={text!r}: expected seconds, a number >= 0")
    return value


class Pool:
    """Host transports shared by every target of one invocation: one SSH connection per host."""

    def __init__(self, inventory: Inventory, *, retry_time: float | None = None) -> None:
        self.inventory = inventory
        self.retry_time = retry_time_from_env() if retry_time is None else retry_time
        # A refused first connect is said at once (a wrong port, no sshd: ssh knows in milliseconds), unless the
        # caller gave a retry budget: then gpuops waits for a host that is coming up.
        self.wait_refused = retry_time is not None or bool(os.environ.get(RETRY_TIME_ENV, "").strip())
        self._hosts: dict[str, Transport] = {}
        self._lock = threading.Lock()

    def host(self, name: str) -> Transport:
        with self._lock:
            if name not in self._hosts:
                host = self.inventory.hosts[name]
                if host.transport == "local":
                    from gpuops.transport.local import LocalTransport

                    self._hosts[name] = LocalTransport(name, command_timeout=host.command_timeout)
                else:
                    self._hosts[name] = _ssh_transport(host, self.inventory.hosts, self.retry_time, self.wait_refused)
            return self._hosts[name]

    def target(self, target: Target) -> Transport:
        return _target_transport(self.host(target.host), target)

    def connect_soon(self, targets: list[Target]) -> None:
        """Start connecting the hosts of `targets` in the background (transport/ssh/head_start.py): what the command
        still does before its first remote call (imports, building its commands) then overlaps the handshakes."""
        names = list(dict.fromkeys(t.host for t in targets))
        if any(self.inventory.hosts[n].transport == "ssh" for n in names):
            from gpuops.transport.ssh.resolve import resolve_hosts_soon

            resolve_hosts_soon(self.inventory.hosts, names)  # `ssh -G` first: it runs while the rest is imported
        for name in names:
            self.host(name).connect_soon()

    def transports(self) -> list[Transport]:
        """The host transports opened so far."""
        return list(self._hosts.values())

    def connections_made(self) -> int:
        return sum(t.connections_made for t in self._hosts.values())

    def commands(self) -> int:
        """Remote commands sent (round trips), over every host."""
        return sum(t.commands for t in self._hosts.values())

    def close(self) -> None:
        for transport in self._hosts.values():
            transport.close()


def ssh_client() -> str | None:
    """The user's `ssh` binary on PATH; None where there is none (then paramiko connects)."""
    import shutil

    return shutil.which("ssh")


def _ssh_transport(host: Host, hosts: Mapping[str, Host], retry_time: float, wait_refused: bool) -> Transport:
    """The user's OpenSSH client carries the connection; paramiko only where there is no `ssh` binary."""
    ssh = ssh_client()
    if ssh:
        from gpuops.transport.ssh.openssh.openssh import OpenSshTransport

        clients_used.add(f"OpenSSH ({ssh})")
        return OpenSshTransport(host, hosts, ssh=ssh, retry_time=retry_time, wait_refused=wait_refused)
    from gpuops.transport.ssh.paramiko_ssh.paramiko_transport import SshTransport

    clients_used.add("paramiko (no ssh on PATH)")
    return SshTransport(host, hosts, retry_time=retry_time)


class _DryHost(HostSide):
    """Renders commands as they would be sent to a host; refuses to run anything."""

    connections_made = 0
    commands = 0

    def __init__(self, label: str, command_timeout: float) -> None:
        self.label = label
        self.command_timeout = command_timeout

    def wrap(self, cmd: Cmd) -> Cmd:
        return cmd

    def render(self, cmd: Cmd, *, display: bool = True) -> str:
        return cmd.render(display=display)

    def run(self, cmd: Cmd, **_: Any) -> Result:
        raise AssertionError("a dry run must not execute commands")

    def open(self, cmd: Cmd) -> Stream:
        raise AssertionError("a dry run must not execute commands")

    def connect_soon(self) -> None:
        raise AssertionError("a dry run must not connect")

    def connect(self) -> None:
        raise AssertionError("a dry run must not connect")

    def reconnect(self) -> None:
        raise AssertionError("a dry run must not connect")

    def close(self) -> None:
        return None


def dry_transport(inventory: Inventory, target: Target) -> Transport:
    """The target's transport shape for --dry-run: renders, never connects."""
    host = inventory.hosts[target.host]
    return _target_transport(_DryHost(host.name, host.command_timeout), target)


def _target_transport(host: Transport, target: Target) -> Transport:
    """The host's transport wrapped for the target: `pct exec CTID --` for a container, then the become
    user's prefix (runuser in a container, sudo or su on a host); root in a container needs none."""
    transport = host
    if target.ctid is not None:
        from gpuops.transport.pct import PctTransport

        transport = PctTransport(transport, target.ctid)
    if target.become_user is not None:
        from gpuops.transport.become import BecomeTransport, method_of

        if method_of(target) is not None:
            transport = BecomeTransport(transport, target.become_user, target.become_method)
    return transport
