"""An Ansible host's variables -> a gpuops host (address, user, port, key, known_hosts, jumps) and target."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from typing import TYPE_CHECKING, Any

from gpuops.config.inventory import _ADDRESS, _USER, CTID_MAX, CTID_MIN
from gpuops.config.model import Host, Target
from gpuops.errors import ConfigError, Mark

if TYPE_CHECKING:
    from gpuops.config.ansible import Layers, Tree, Var

SSH_CONNECTIONS = {"ssh", "smart", "paramiko", "paramiko_ssh", "ansible.builtin.ssh", "ansible.legacy.ssh",
                   "ansible.builtin.paramiko_ssh"}  # fmt: skip
LOCAL_CONNECTIONS = {"local", "ansible.builtin.local", "ansible.legacy.local"}
SSH_ARGS = ("ansible_ssh_common_args", "ansible_ssh_extra_args")  # the order Ansible puts them on ssh's argv
_HOP = re.compile(r"(?:ssh://)?(?:([^@\s]+)@)?(\[[0-9A-Fa-f:.]+\]|[^\s@:\[\]]+)(?::([0-9]{1,5}))?\Z")
_FLAGS = re.compile(r"-[46AaCqTvxNn]+\Z")  # ssh flags without an argument, allowed in a ProxyCommand


class HostBuilder:
    """Builds gpuops hosts from Ansible hosts: equal ssh settings share one host (one connection)."""

    def __init__(self, tree: Tree, layers: Layers) -> None:
        self.tree, self.layers = tree, layers
        self.hosts: dict[str, Host] = {}
        self._keys: dict[tuple[Any, ...], str] = {}
        self._of: dict[str, str | None] = {}
        self._stack: list[str] = []

    def target(self, name: str) -> Target | None:
        """The target named after Ansible host `name`; None when it is not reached over ssh or locally."""
        mark = self.tree.host_marks[name]
        host = self.host_of(name, mark)
        if host is None:
            return None
        v = self.layers.host_vars(name)
        ctid_var = _get(v, "gpuops_ctid", "proxmox_vmid")
        ctid = integer(ctid_var, CTID_MIN, CTID_MAX, "a container id") if ctid_var else None
        gpus_var = _get(v, "gpuops_gpus")
        return Target(name=name, host=host, ctid=ctid, gpus=gpu_list(gpus_var) if gpus_var else (), mark=mark)

    def host_of(self, name: str, mark: Mark) -> str | None:
        """The gpuops host Ansible host `name` is reached through (its jump hosts built first)."""
        if name in self._of:
            return self._of[name]
        if name in self._stack:
            raise ConfigError(mark, f"jump loop: {' -> '.join([*self._stack[self._stack.index(name):], name])}")
        self._stack.append(name)
        try:
            self._of[name] = self._build(name)
        finally:
            self._stack.pop()
        return self._of[name]

    def _build(self, name: str) -> str | None:
        v = self.layers.host_vars(name)
        conn = _get(v, "ansible_connection")
        connection = text(conn, "a connection plugin name") if conn else "ssh"
        if connection in LOCAL_CONNECTIONS:
            return self._add(Host(name="", transport="local"), name, name)
        if connection not in SSH_CONNECTIONS:
            return None  # winrm, docker, ...: not a gpuops target
        address_var = _get(v, "ansible_host", "ansible_ssh_host")
        address = matching(address_var, _ADDRESS, "a host name or IP address") if address_var else name
        fields: dict[str, Any] = {"address": address}
        if (var := _get(v, "ansible_user", "ansible_ssh_user")) is not None:
            fields["user"] = matching(var, _USER, "a user name")
        if (var := _get(v, "ansible_port", "ansible_ssh_port")) is not None:
            fields["port"] = integer(var, 1, 65535, "a port number")
        if (var := _get(v, "ansible_ssh_private_key_file", "ansible_private_key_file")) is not None:
            fields["identity_file"] = text(var, "a path to a private key")
        if (var := _get(v, "ansible_ssh_timeout", "ansible_timeout")) is not None:
            fields["connect_timeout"] = float(integer(var, 1, 86400, "a number of seconds"))
        options = ssh_options(v)
        known = _get(v, "gpuops_known_hosts")
        if known is not None:
            fields["known_hosts"] = text(known, "a path to a known_hosts file")
        elif "userknownhostsfile" in options:
            fields["known_hosts"] = options["userknownhostsfile"][0].split()[0]
        policy = _get(v, "gpuops_host_key_policy")
        if policy is not None:
            fields["host_key_policy"] = choice(policy, ("strict", "accept-new"), "a host key policy")
        elif options.get("stricthostkeychecking", ("",))[0].lower() == "accept-new":
            fields["host_key_policy"] = "accept-new"  # yes/ask are strict; no/off too: gpuops never skips the check
        host = Host(name="", mark=self.tree.host_marks[name], **fields)
        jump = self._jump_of(options, host)
        return self._add(dataclasses.replace(host, jump=jump), address, name)

    def _jump_of(self, options: dict[str, tuple[str, Mark]], host: Host) -> str | None:
        if "proxyjump" in options:
            spec, mark = options["proxyjump"]
            return None if spec.lower() == "none" else self._chain(spec, mark, host, None)
        if "proxycommand" in options and options["proxycommand"][0].lower() != "none":
            spec, key = proxy_command(*options["proxycommand"])
            return self._chain(spec, options["proxycommand"][1], host, key)
        return None

    def _chain(self, spec: str, mark: Mark, owner: Host, key: str | None) -> str:
        """ProxyJump a,b: a as it is, b reached through a, the host through b; the last hop's name."""
        previous: str | None = None
        for hop in spec.split(","):
            found = _HOP.match(hop.strip())
            if not found:
                raise ConfigError(mark, f"expected ProxyJump hosts as [user@]host[:port], comma-separated, got {hop!r}")
            user, address, port = found.group(1), found.group(2).strip("[]"), found.group(3)
            if address in self.tree.hosts:  # an inventory host: its own settings (and its own jump, first hop only)
                name = self.host_of(address, mark)
                if name is None or self.hosts[name].transport != "ssh":
                    raise ConfigError(mark, f"jump host '{address}' is not reached over ssh (see its ansible_connection)")
                base, label = self.hosts[name], name
            else:
                if not _ADDRESS.match(address):
                    raise ConfigError(mark, f"expected a host name or IP address in ProxyJump, got {address!r}")
                base = Host(name="", address=address, known_hosts=owner.known_hosts, identity_file=key,
                            host_key_policy=owner.host_key_policy, connect_timeout=owner.connect_timeout, mark=mark)
                label = address
            changes: dict[str, Any] = {"jump": previous} if previous is not None else {}
            if user is not None:
                changes["user"] = user
            if port is not None:
                changes["port"] = _port(int(port), mark)
            if changes or base.name == "":
                previous = self._add(dataclasses.replace(base, **changes), label, hop.strip())
            else:
                previous = label
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


def ssh_options(v: dict[str, Var]) -> dict[str, tuple[str, Mark]]:
    """-o Key=Value / -o 'Key Value' / -J hops from the ssh args; the first one given wins, as in ssh."""
    options: dict[str, tuple[str, Mark]] = {}
    for name in SSH_ARGS:
        var = _get(v, name)
        if var is None:
            continue
        try:
            argv = shlex.split(text(var, "ssh arguments"))
        except ValueError as exc:
            raise ConfigError(var.mark, f"cannot read {name}: {exc} (check its quotes)") from None
        i = 0
        while i < len(argv):
            flag, i = argv[i][:2], i + 1
            if flag not in ("-o", "-J"):
                continue
            arg = argv[i - 1][2:]
            if not arg:
                if i >= len(argv):
                    raise ConfigError(var.mark, f"{flag} at the end of {name} needs a value")
                arg, i = argv[i], i + 1
            if flag == "-J":
                key, value = "proxyjump", arg
            else:
                key, _, value = arg.partition("=") if "=" in arg else arg.partition(" ")
            options.setdefault(key.strip().lower(), (value.strip(), var.mark))
    return options


def proxy_command(command: str, mark: Mark) -> tuple[str, str | None]:
    """`ssh [-q] [-p P] [-l U] [-i KEY] -W %h:%p [user@]host` -> (the jump as [user@]host[:port], KEY)."""
    form = "write -o ProxyJump=[user@]host[:port] instead, or a ProxyCommand of the form `ssh -W %h:%p [user@]host`"
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(mark, f"cannot read the ProxyCommand: {exc}") from None
    if not argv or os.path.basename(argv[0]) != "ssh" or "-W" not in argv:
        raise ConfigError(mark, f"ProxyCommand {command!r} is not read by gpuops: {form}")
    values: dict[str, str] = {}
    dest = None
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-W", "-p", "-l", "-i") and i + 1 < len(argv):
            values[arg], i = argv[i + 1], i + 2
        elif _FLAGS.match(arg):
            i += 1
        elif dest is None and not arg.startswith("-"):
            dest, i = arg, i + 1
        else:
            raise ConfigError(mark, f"ProxyCommand {command!r}: gpuops does not read {arg!r}; {form}")
    if dest is None or values.get("-W") != "%h:%p":
        raise ConfigError(mark, f"ProxyCommand {command!r}: expected -W %h:%p and a host; {form}")
    spec = (f"{values['-l']}@" if "-l" in values and "@" not in dest else "") + dest
    if "-p" in values:
        spec += f":{values['-p']}"
    return spec, values.get("-i")


# -- typed readers of a variable (a YAML node or an INI value), errors at the value -------------


def _get(v: dict[str, Var], *names: str) -> Var | None:
    """The first of `names` set to something other than null."""
    from gpuops.config.ansible import plain

    for name in names:
        var = v.get(name)
        if var is not None and plain(var.value) is not None:
            return var
    return None


def _value(var: Var) -> Any:
    from gpuops.config.ansible import plain

    return plain(var.value)


def show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    return str(value)


def text(var: Var, what: str) -> str:
    value = _value(var)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(var.mark, f"expected {what}, got {show(value)}")
    value = str(value)
    if "{{" in value or "{%" in value:
        raise ConfigError(var.mark, f"expected {what}, got the Jinja template {show(value)}: gpuops does not "
                                    "evaluate templates; write the value itself (a host_vars/ or group_vars/ file may hold it)")
    if "\x00" in value:
        raise ConfigError(var.mark, f"expected {what} without NUL characters")
    return value


def matching(var: Var, pattern: re.Pattern[str], what: str) -> str:
    value = text(var, what)
    if not pattern.match(value):
        raise ConfigError(var.mark, f"expected {what}, got {show(value)}")
    return value


def choice(var: Var, options: tuple[str, ...], what: str) -> str:
    value = text(var, what)
    if value not in options:
        raise ConfigError(var.mark, f"expected {what}: {' | '.join(options)}, got {show(value)}")
    return value


def _int_like(value: Any) -> int | None:
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 18:
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def integer(var: Var, low: int, high: int, what: str) -> int:
    value = _value(var)
    number = _int_like(value)
    if number is None or not low <= number <= high:
        raise ConfigError(var.mark, f"expected {what} (an integer {low}..{high}), got {show(value)}")
    return number


def _port(port: int, mark: Mark) -> int:
    if not 1 <= port <= 65535:
        raise ConfigError(mark, f"expected a port number (an integer 1..65535) in ProxyJump, got {port}")
    return port


def gpu_list(var: Var) -> tuple[int, ...]:
    """gpuops_gpus: a list [0, 1], or text '0,1' / '[0, 1]' (INI :vars values are text), or one index."""
    value = _value(var)
    if isinstance(value, str):
        items: list[Any] = [x.strip() for x in value.strip().strip("[]()").split(",") if x.strip()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    gpus: dict[int, None] = {}
    for item in items:
        gpu = _int_like(item)
        if gpu is None or gpu < 0:
            raise ConfigError(var.mark, f"expected GPU indexes (e.g. [0, 1]) in gpuops_gpus, got {show(item)}")
        if gpu in gpus:
            raise ConfigError(var.mark, f"GPU {gpu} is listed twice in gpuops_gpus")
        gpus[gpu] = None
    return tuple(gpus)
