"""An Ansible host's variables -> a gpuops host (address, user, port, key, known_hosts, jumps) and target."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from gpuops.config import schema as s
from gpuops.config.ansible.become_vars import become_of
from gpuops.config.ansible.layers import Layers
from gpuops.config.ansible.sshargs import proxy_command, ssh_args
from gpuops.config.ansible.tree import Tree, first_set
from gpuops.errors import ConfigError
from gpuops.position import Mark
from gpuops.targets import Host, Target

SSH_CONNECTIONS = {"ssh", "smart", "paramiko", "paramiko_ssh", "ansible.builtin.ssh", "ansible.legacy.ssh",
                   "ansible.builtin.paramiko_ssh"}  # fmt: skip
LOCAL_CONNECTIONS = {"local", "ansible.builtin.local", "ansible.legacy.local"}
_HOP = re.compile(r"(?:ssh://)?(?:([^@\s]+)@)?(\[[0-9A-Fa-f:.]+\]|[^\s@:\[\]]+)(?::([0-9]{1,5}))?\Z")


class HostBuilder:
    """Builds gpuops hosts from Ansible hosts: equal ssh settings share one host (one connection)."""

    def __init__(self, tree: Tree, layers: Layers) -> None:
        self.tree, self.layers = tree, layers
        self.hosts: dict[str, Host] = {}
        self._keys: dict[tuple[Any, ...], str] = {}
        self._of: dict[str, str | None] = {}

    def target(self, name: str) -> Target | None:
        """The target named after Ansible host `name`; None when it is not reached over ssh or locally."""
        mark = self.tree.host_marks[name]
        host = self.host_of(name)
        if host is None:
            return None
        v = self.layers.host_vars(name)
        ctid_var = first_set(v, "gpuops_ctid", "proxmox_vmid")
        ctid = ctid_var.integer(s.CTID_MIN, s.CTID_MAX, "a container id") if ctid_var else None
        gpus_var = first_set(v, "gpuops_gpus")
        rdzv_var = first_set(v, "gpuops_rdzv_address")
        rdzv = rdzv_var.text("an address the other nodes reach this target by") if rdzv_var else None
        user, method = become_of(v)
        return Target(name=name, host=host, ctid=ctid, gpus=gpus_var.gpus() if gpus_var else (), mark=mark,
                      become_user=user, become_method=method, rdzv_address=rdzv)  # type: ignore[arg-type]

    def host_of(self, name: str) -> str | None:
        """The gpuops host Ansible host `name` is reached through (its jump hosts built first)."""
        if name not in self._of:
            self._of[name] = self._build(name)
        return self._of[name]

    def _build(self, name: str) -> str | None:
        v = self.layers.host_vars(name)
        conn = first_set(v, "ansible_connection")
        connection = conn.text("a connection plugin name") if conn else "ssh"
        if connection in LOCAL_CONNECTIONS:
            return self._add(Host(name="", transport="local"), name, name)
        if connection not in SSH_CONNECTIONS:
            return None  # winrm, docker, ...: not a gpuops target
        # Where both spellings are set Ansible's ssh plugin takes the last of its `vars:` list: the legacy one.
        address_var = first_set(v, "ansible_ssh_host", "ansible_host")
        address = address_var.matching(s.ADDRESS, "a host name or IP address") if address_var else name
        fields: dict[str, Any] = {"address": address}
        if (var := first_set(v, "ansible_ssh_user", "ansible_user")) is not None:
            fields["user"] = var.matching(s.USER, "a user name")
        if (var := first_set(v, "ansible_ssh_port", "ansible_port")) is not None:
            fields["port"] = var.integer(s.PORT_MIN, s.PORT_MAX, "a port number")
        if (var := first_set(v, "ansible_ssh_private_key_file", "ansible_private_key_file")) is not None:
            fields["identity_file"] = var.text("a path to a private key")
        if (var := first_set(v, "ansible_ssh_timeout", "ansible_timeout")) is not None:
            fields["connect_timeout"] = float(var.integer(1, 86400, "a number of seconds"))
        argv, options = ssh_args(v)
        fields["ssh_args"] = argv  # -p, -l, -i, -F, -o ...: resolved by `ssh -G ARGS HOST` when connecting
        known = first_set(v, "gpuops_known_hosts")
        if known is not None:
            fields["known_hosts"] = known.text("a path to a known_hosts file")
        elif "userknownhostsfile" in options:
            fields["known_hosts"] = options["userknownhostsfile"][0].split()[0]
        policy = first_set(v, "gpuops_host_key_policy")
        if policy is not None:
            fields["host_key_policy"] = policy.choice(("strict", "accept-new"), "a host key policy")
        elif "stricthostkeychecking" in options:  # yes/ask are strict; no/off too: gpuops never skips the check
            fields["host_key_policy"] = "accept-new" if options["stricthostkeychecking"][0].lower() == "accept-new" else "strict"
        host = Host(name="", mark=self.tree.host_marks[name], **fields)
        jump = self._jump_of(options, host)
        return self._add(dataclasses.replace(host, jump=jump), address, name)

    def _jump_of(self, options: dict[str, tuple[str, Mark]], host: Host) -> str | None:
        if "proxyjump" in options:
            spec, mark = options["proxyjump"]
            return None if spec.lower() == "none" else self._chain(spec, mark, host, None)
        if "proxycommand" in options and options["proxycommand"][0].lower() != "none":
            found = proxy_command(*options["proxycommand"])
            if found is not None:  # `ssh -W %h:%p HOP`: the hop, checked as every hop is
                return self._chain(found[0], options["proxycommand"][1], host, found[1])
        return None  # any other ProxyCommand is run as ssh runs it (transport/ssh/paramiko_ssh/chain.py)

    def _chain(self, spec: str, mark: Mark, owner: Host, key: str | None) -> str:
        """ProxyJump a,b: a as it is, b reached through a, the host through b; the last hop's name."""
        previous: str | None = None
        for hop in spec.split(","):
            found = _HOP.match(hop.strip())
            if not found:
                raise ConfigError(mark, f"expected ProxyJump hosts as [user@]host[:port], comma-separated, got {hop!r}")
            user, address, port = found.group(1), found.group(2).strip("[]"), found.group(3)
            # ssh resolves a hop's name through ssh config, as Ansible's ssh does: an inventory host of the
            # same name lends it nothing (its ansible_host, user, port are for connecting to it, not through it).
            if not s.ADDRESS.match(address):
                raise ConfigError(mark, f"expected a host name or IP address in ProxyJump, got {address!r}")
            base = Host(name="", address=address, known_hosts=owner.known_hosts, identity_file=key,
                        host_key_policy=owner.host_key_policy, connect_timeout=owner.connect_timeout, mark=mark)
            changes: dict[str, Any] = {"jump": previous} if previous is not None else {}
            if user is not None:
                changes["user"] = user
            if port is not None:
                changes["port"] = _port(int(port), mark)
            previous = self._add(dataclasses.replace(base, **changes), address, hop.strip())
        assert previous is not None
        return previous

    def _add(self, host: Host, label: str, origin: str) -> str:
        """The name of the host with these settings: `label` (its address) if free, else `user@address:port -J jump`."""
        key = dataclasses.astuple(dataclasses.replace(host, name="", mark=None))
        if key in self._keys:
            return self._keys[key]
        user = f"{host.user}@" if host.user else ""
        port = f":{host.port}" if host.port else ""
        spelled = f"{user}{host.address or label}{port}" + (f" -J {host.jump}" if host.jump else "")
        candidates = [label, spelled, f"{spelled} ({origin})"]
        name = next((c for c in candidates if c not in self.hosts), None)
        n = 1
        while name is None or name in self.hosts:
            n += 1
            name = f"{spelled} ({origin} {n})"
        self.hosts[name] = dataclasses.replace(host, name=name)
        self._keys[key] = name
        return name


def _port(port: int, mark: Mark) -> int:
    if not s.PORT_MIN <= port <= s.PORT_MAX:
        raise ConfigError(mark, f"expected a port number (an integer {s.PORT_MIN}..{s.PORT_MAX}) in ProxyJump, got {port}")
    return port
