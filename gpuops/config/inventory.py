"""gpuops' own inventory format (a plugin of load_inventory): hosts and the targets on them, validated with
file:line:col errors; and picking targets from any inventory by name or group."""

from __future__ import annotations

import os
from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable

from gpuops.config import schema as s
from gpuops.config.source import Source
from gpuops.config.yamlpos import NO_VAULT, Node, first_vault
from gpuops.errors import ConfigError, UsageError
from gpuops.position import Mark
from gpuops.targets import Host, Inventory, Target

if TYPE_CHECKING:
    from gpuops.config.playbook_model import Playbook

INVENTORY_KEYS = ("hosts", "targets")
SSH_KEYS = (
    "address",
    "user",
    "port",
    "identity_file",
    "known_hosts",
    "host_key_policy",
    "jump",
    "connect_timeout",
)
HOST_KEYS = ("transport", *SSH_KEYS, "command_timeout")
TARGET_KEYS = ("host", "ctid", "gpus", "become_user", "become_method", "rdzv_address")


def accepts(source: Source) -> bool:
    """YAML with hosts: or targets: at the top, an empty file, or any YAML file named .yml/.yaml/.json."""
    return source.parses() and (bool(source.top_keys() & set(INVENTORY_KEYS)) or source.root is None
                                or source.yaml_named)


def load(source: Source) -> Inventory:
    """Read and validate gpuops' own inventory format."""
    path, root = source.path, source.root
    if root is None:
        raise ConfigError(Mark(path, 1, 1), "the file is empty; expected an inventory with keys: hosts, targets")
    vaulted = first_vault(root)
    if vaulted is not None:
        raise ConfigError(vaulted.mark, NO_VAULT)
    top = s.Section(root, "the inventory", INVENTORY_KEYS)
    hosts: dict[str, Host] = {}
    jump_marks: dict[str, Mark] = {}
    hosts_node = top.get("hosts")
    if hosts_node is not None:
        for key, value in s.entries(hosts_node, "hosts"):
            host_name = s.name(key, "a host name")
            hosts[host_name] = _host(host_name, key.mark, value, jump_marks)
    _check_jumps(hosts, jump_marks)
    targets: dict[str, Target] = {}
    targets_node = top.get("targets")
    if targets_node is not None:
        for key, value in s.entries(targets_node, "targets"):
            target_name = s.name(key, "a target name")
            targets[target_name] = _target(target_name, key.mark, value, hosts)
    return Inventory(
        path=os.path.abspath(path), hosts=MappingProxyType(hosts), targets=MappingProxyType(targets)
    )


def _host(name: str, mark: Mark, node: Node, jump_marks: dict[str, Mark]) -> Host:
    sec = s.Section(node, f"host '{name}'", HOST_KEYS)
    transport_node = sec.get("transport")
    transport = s.choice(transport_node, ("ssh", "local"), "transport") if transport_node else "ssh"
    fields: dict[str, object] = {}
    if transport == "local":
        for key in SSH_KEYS:
            if sec.given(key):
                raise ConfigError(
                    sec.key_mark(key),
                    f"'{key}' does not apply to host '{name}' (transport: local takes no ssh settings)",
                )
    if (n := sec.get("address")) is not None:
        fields["address"] = s.text_matching(n, s.ADDRESS, "a host name or IP address")
    if (n := sec.get("user")) is not None:
        fields["user"] = s.text_matching(n, s.USER, "a user name")
    if (n := sec.get("port")) is not None:
        fields["port"] = s.integer(n, s.PORT_MIN, s.PORT_MAX, "a port number")
    if (n := sec.get("identity_file")) is not None:
        fields["identity_file"] = s.nonempty(n, "a path to a private key")
    if (n := sec.get("known_hosts")) is not None:
        fields["known_hosts"] = s.nonempty(n, "a path to a known_hosts file")
    if (n := sec.get("host_key_policy")) is not None:
        fields["host_key_policy"] = s.choice(n, ("strict", "accept-new"), "a host key policy")
    if (n := sec.get("jump")) is not None:
        fields["jump"] = s.name(n, "a host name")
        jump_marks[name] = n.mark
    for key in ("connect_timeout", "command_timeout"):
        if (n := sec.get(key)) is not None:
            fields[key] = s.seconds(n, zero_ok=False)
    return Host(name=name, transport=transport, mark=mark, **fields)  # type: ignore[arg-type]


def _check_jumps(hosts: dict[str, Host], marks: dict[str, Mark]) -> None:
    """Every jump names an ssh host of this file, and following jumps never comes back."""
    for host in hosts.values():
        if host.jump is None:
            continue
        target = hosts.get(host.jump)
        if target is None:
            raise ConfigError(
                marks[host.name],
                f"jump names unknown host '{host.jump}' (hosts: {', '.join(hosts)}){s.suggest(host.jump, hosts)}",
            )
        if target.transport == "local":
            raise ConfigError(
                marks[host.name], f"jump names host '{host.jump}', which is local (a jump host must use ssh)"
            )
    loop_free: set[str] = set()  # hosts whose jump chain is known to end: each chain is walked once
    for start in hosts:
        path: dict[str, int] = {}
        hop: str | None = start
        while hop is not None and hop not in loop_free:
            if hop in path:
                cycle = [*list(path)[path[hop] :], hop]
                raise ConfigError(marks[cycle[0]], f"jump loop: {' -> '.join(cycle)}")
            path[hop] = len(path)
            hop = hosts[hop].jump
        loop_free.update(path)


def _target(name: str, mark: Mark, node: Node, hosts: dict[str, Host]) -> Target:
    sec = s.Section(node, f"target '{name}'", TARGET_KEYS)
    host_node = sec.require("host", "the name of a host under hosts")
    host = s.name(host_node, "a host name")
    if host not in hosts:
        known = ", ".join(hosts) if hosts else "none defined"
        raise ConfigError(host_node.mark, f"unknown host '{host}' (hosts: {known}){s.suggest(host, hosts)}")
    ctid_node = sec.get("ctid")
    ctid = s.integer(ctid_node, s.CTID_MIN, s.CTID_MAX, "a container id") if ctid_node else None
    gpus_node = sec.get("gpus")
    gpus = s.gpu_list(gpus_node) if gpus_node else ()
    rdzv_node = sec.get("rdzv_address")
    rdzv = s.text_matching(rdzv_node, s.ADDRESS, "an address the other nodes reach this target by") if rdzv_node else None
    user_node = sec.get("become_user")
    user = s.text_matching(user_node, s.USER, "a user name") if user_node else None
    method_node = sec.get("become_method")
    method = s.choice(method_node, ("sudo", "su"), "a become method") if method_node else "sudo"
    if method_node is not None and user is None:
        raise ConfigError(sec.key_mark("become_method"), f"become_method needs become_user in target '{name}'")
    return Target(name=name, host=host, ctid=ctid, gpus=gpus, mark=mark, become_user=user,
                  become_method=method, rdzv_address=rdzv)  # type: ignore[arg-type]


def resolve_target(inventory: Inventory, playbook: Playbook | None, name: str | None) -> Target:
    """The target to act on: NAME (from -t) if given, else the playbook's default target."""
    known = ", ".join(inventory.targets) or "none"
    if name is None:
        if playbook is None or playbook.target is None:
            raise UsageError(
                f"no target given: pass -t NAME or set 'target:' in the playbook (targets in {inventory.path}: {known})"
            )
        if playbook.target in inventory.broken:
            raise inventory.broken[playbook.target]
        target = inventory.targets.get(playbook.target)
        if target is None:
            raise ConfigError(
                playbook.target_mark,
                f"unknown target '{playbook.target}' (targets in {inventory.path}: {known})"
                f"{s.suggest(playbook.target, inventory.targets)}",
                file=playbook.path,
            )
    else:
        if name in inventory.broken:
            raise inventory.broken[name]
        target = inventory.targets.get(name)
        if target is None:
            members = inventory.groups.get(name)
            if members:
                raise UsageError(f"'{name}' is a group of {len(members)} target(s) ({', '.join(members)}); "
                                 "this command acts on one target: pass -t with one of them")
            raise _unknown(inventory, name)
    if playbook is not None:
        _check_gpus(target, playbook)
    return target


def resolve_targets(inventory: Inventory, names: Iterable[str]) -> list[Target]:
    """The targets `-t NAME ...` selects: a target by its name, every target of a group (and its children),
    or an Ansible host pattern (`a:b`, `a:!b`, `a:&b`, `ct20*`, `~regex`) as Ansible resolves it."""
    from gpuops.config.patterns import is_pattern, select

    chosen: dict[str, None] = {}
    for name in names:
        if is_pattern(name):
            found = select(inventory, name)
            if not found:
                raise UsageError(f"no target matches the host pattern {name!r} in {inventory.path}")
            chosen.update(dict.fromkeys(found))
            continue
        if name in inventory.targets or name in inventory.broken:
            chosen.setdefault(name)
            continue
        members = inventory.groups.get(name)
        if members is None:
            raise _unknown(inventory, name)
        if not members:
            raise UsageError(f"group '{name}' in {inventory.path} has no targets")
        chosen.update(dict.fromkeys(members))
    return usable(inventory, chosen)


def usable(inventory: Inventory, names: Iterable[str]) -> list[Target]:
    """The targets of `names`; one that cannot be used (a template in its values) is its error, at its place."""
    out = []
    for name in names:
        if name in inventory.broken:
            raise inventory.broken[name]
        out.append(inventory.targets[name])
    return out


def _unknown(inventory: Inventory, name: str) -> UsageError:
    known = ", ".join(inventory.targets) or "none"
    groups = [g for g in inventory.groups if g not in ("all", "ungrouped")]
    listed = f"; groups: {', '.join(groups)}" if groups else ""
    return UsageError(f"unknown target '{name}' (targets in {inventory.path}: {known}{listed})"
                      f"{s.suggest(name, [*inventory.targets, *inventory.groups])}")


def _check_gpus(target: Target, playbook: Playbook) -> None:
    """A playbook may only use GPUs the target declares (when it declares any)."""
    if not target.gpus:
        return
    available = set(target.gpus)
    for section, gpus, mark in (
        ("preflight", playbook.preflight.gpus, playbook.preflight.gpus_mark),
        ("warmup", playbook.warmup.gpus if playbook.warmup else (), playbook.warmup.gpus_mark if playbook.warmup else None),
    ):
        for gpu in gpus:
            if gpu not in available:
                raise ConfigError(
                    mark,
                    f"{section} uses GPU {gpu}, which target '{target.name}' does not have "
                    f"(its gpus: {', '.join(map(str, target.gpus))})",
                    file=playbook.path,
                )
