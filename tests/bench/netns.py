"""A host the tests can cut off: a private network namespace behind a veth pair, and an sshd in it.

    root namespace                         namespace gpuops-net-<pid>-<n>
    gn<pid>-<n>h  10.231.X.1/30  <--veth-->  gn<pid>-<n>n  10.231.X.2/30   sshd listens here

Faults, all confined to that namespace's own link and firewall:
  link_down()/link_up()   the namespace's end of the veth goes down: packets to it vanish (the
                          root end stays up, so its /30 route stays and nothing leaks elsewhere)
  block(port)/unblock()   an iptables DROP rule for the port inside the namespace: a silent blackhole
A guard route (`unreachable <subnet>`, high metric) in the root namespace makes sure a packet for the
subnet can never take the default route, even while the veth is being torn down.

Everything is removed by destroy() (also used by the context manager and the fixture), and a
later NetNs() sweeps namespaces, veths and guard routes left behind by a process that died.
Needs root (CAP_NET_ADMIN) and `ip`; block() needs `iptables`. NetnsUnavailable says why not.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import shutil
import subprocess
from pathlib import Path

from bench import procs

PREFIX = "gpuops-net-"
POOL = ipaddress.ip_network("10.231.0.0/16")  # private; each namespace takes one /30 of it
FIRST = ipaddress.ip_network("10.231.7.0/30")
GUARD_METRIC = 4242
LOCK = Path("/tmp/gpuops-bench-netns.lock")
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-(\d+)$")
_count = 0


class NetnsUnavailable(RuntimeError):
    """This machine does not let us create a network namespace (or lacks a tool); the text says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip() or f'exit {result.returncode}'}")
    return result


def _links(token: str) -> tuple[str, str]:
    """The veth names for a namespace token `<pid>-<n>` (interface names are at most 15 bytes)."""
    return f"gn{token}h", f"gn{token}n"


class NetNs:
    """A network namespace linked to this one by a veth pair with a /30 of its own."""

    def __init__(self) -> None:
        global _count
        _count += 1
        token = f"{os.getpid()}-{_count}"
        self.name = PREFIX + token
        self.host_if, self.ns_if = _links(token)
        self.subnet: ipaddress.IPv4Network | None = None
        self.host_addr = ""  # this namespace's end of the veth
        self.addr = ""  # the namespace's end: where its servers listen
        self._created = False
        self._blocked: set[int] = set()

    # -- lifecycle ------------------------------------------------------------------------
    def create(self) -> "NetNs":
        """Make the namespace, the veth pair, the addresses and the guard route; raise NetnsUnavailable if we may not."""
        if shutil.which("ip") is None:
            raise NetnsUnavailable("`ip` (iproute2) is not installed")
        LOCK.touch(exist_ok=True)
        with LOCK.open("r+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test processes pick distinct subnets
            sweep_stale()
            made = _ip("netns", "add", self.name, check=False)
            if made.returncode != 0:
                raise NetnsUnavailable(f"`ip netns add` is not permitted here: {made.stderr.strip()}")
            self._created = True
            try:
                self._wire(self._free_subnet())
            except BaseException as exc:
                self.destroy()
                if type(exc) is RuntimeError:  # an `ip` command failed, e.g. no veth support in this kernel
                    raise NetnsUnavailable(f"cannot wire a veth pair to the namespace: {exc}") from None
                raise
        return self

    def _wire(self, subnet: ipaddress.IPv4Network) -> None:
        host, ns = list(subnet.hosts())
        self.subnet, self.host_addr, self.addr = subnet, str(host), str(ns)
        _ip("route", "add", "unreachable", str(subnet), "metric", str(GUARD_METRIC))
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if, "netns", self.name)
        _ip("addr", "add", f"{host}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        self.ns_ip("addr", "add", f"{ns}/30", "dev", self.ns_if)
        self.ns_ip("link", "set", self.ns_if, "up")
        self.ns_ip("link", "set", "lo", "up")
        entered = subprocess.run(self.exec_argv("true"), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        if entered.returncode != 0:
            raise NetnsUnavailable(f"`ip netns exec` is not permitted here: {entered.stderr.strip()}")

    def destroy(self) -> None:
        """Remove the veth pair, the guard route and the namespace (idempotent; firewall rules go with it)."""
        if not self._created:
            return
        _ip("link", "del", self.host_if, check=False)  # deletes both ends
        if self.subnet is not None:
            _ip("route", "del", "unreachable", str(self.subnet), "metric", str(GUARD_METRIC), check=False)
        _ip("netns", "del", self.name, check=False)
        self._created = False

    def __enter__(self) -> "NetNs":
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # -- running things inside ------------------------------------------------------------
    def exec_argv(self, *argv: str) -> list[str]:
        """`ip netns exec <name> argv...`: run a program inside (as an SshServer launcher, for one)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def ns_ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _ip("-n", self.name, *args, check=check)

    def pids(self) -> list[int]:
        """Processes living in the namespace (its sshd, the sessions it serves)."""
        out = _ip("netns", "pids", self.name, check=False).stdout
        return sorted(int(p) for p in out.split() if p.isdigit())

    # -- faults ---------------------------------------------------------------------------
    def link_down(self) -> None:
        """Take the namespace's end of the veth down: the host vanishes (connects fail, packets are lost)."""
        self.ns_ip("link", "set", self.ns_if, "down")

    def link_up(self) -> None:
        self.ns_ip("link", "set", self.ns_if, "up")

    def block(self, port: int) -> None:
        """Drop every TCP packet to and from `port` inside the namespace: a silent blackhole."""
        if shutil.which("iptables") is None:
            raise NetnsUnavailable("`iptables` is not installed")
        for rule in _rules(port):
            self._iptables("-I", *rule)
        self._blocked.add(port)

    def unblock(self, port: int | None = None) -> None:
        """Remove the DROP rules for `port` (all ports when None)."""
        for p in sorted(self._blocked) if port is None else [port]:
            for rule in _rules(p):
                self._iptables("-D", *rule)
            self._blocked.discard(p)

    def _iptables(self, *args: str) -> None:
        argv = self.exec_argv("iptables", "-w", "5", *args)
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")

    def _free_subnet(self) -> ipaddress.IPv4Network:
        """The first /30 of the pool (from 10.231.7.0/30) that no address or route here overlaps."""
        taken = _used_networks()
        for subnet in POOL.subnets(new_prefix=30):
            if subnet < FIRST:
                continue
            if not any(subnet.overlaps(net) for net in taken):
                return subnet
        raise RuntimeError(f"no free /30 left in {POOL}")

    def __repr__(self) -> str:
        return f"NetNs({self.name}, {self.host_addr} <-> {self.addr})"


def _rules(port: int) -> list[tuple[str, ...]]:
    return [
        ("INPUT", "-p", "tcp", "--dport", str(port), "-j", "DROP"),
        ("OUTPUT", "-p", "tcp", "--sport", str(port), "-j", "DROP"),
    ]


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this namespace has an address in or a route to (the default route excepted)."""
    found = []
    for args in (("-4", "-o", "addr", "show"), ("-4", "route", "show", "table", "all")):
        for line in _ip(*args, check=False).stdout.splitlines():
            for word in line.split():
                if re.fullmatch(r"\d+\.\d+\.\d+\.\d+(/\d+)?", word):
                    try:
                        found.append(ipaddress.ip_network(word, strict=False))
                    except ValueError:
                        pass
    return [net for net in found if net.prefixlen > 0]


def sweep_stale() -> list[str]:
    """Remove our namespaces, veths and guard routes whose creating process is gone; return the namespaces."""
    gone = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        m = _NAME.match(line.split()[0]) if line.split() else None
        if not m or procs.is_alive(int(m.group(1))):
            continue
        _ip("link", "del", _links(f"{m.group(1)}-{m.group(2)}")[0], check=False)
        _ip("netns", "del", m.group(0), check=False)
        gone.append(m.group(0))
    addrs = _ip("-4", "-o", "addr", "show", check=False).stdout
    live = {ipaddress.ip_network(c, strict=False) for c in re.findall(r"inet (\S+/30)", addrs)}
    for line in _ip("-4", "route", "show", "type", "unreachable", check=False).stdout.splitlines():
        words = line.split()
        if f"metric {GUARD_METRIC}" not in line or len(words) < 2:
            continue
        try:
            net = ipaddress.ip_network(words[1])
        except ValueError:
            continue
        if net.subnet_of(POOL) and net not in live:
            _ip("route", "del", "unreachable", str(net), "metric", str(GUARD_METRIC), check=False)
    return gone
