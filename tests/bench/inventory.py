"""Write inventory YAML files (the contract's format) that point at a bench SshServer."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import yaml

from bench.sshd import SshServer


def host_entry(
    server: SshServer, *, policy: str = "strict", known_hosts: str | os.PathLike[str] | None = None, **extra: Any
) -> dict[str, Any]:
    """One `hosts:` entry for `server`: address, user, port, key, known_hosts file and policy."""
    entry: dict[str, Any] = {
        "address": server.host,
        "user": server.user,
        "port": server.port,
        "identity_file": str(server.client_key),
        "known_hosts": str(known_hosts if known_hosts is not None else server.known_hosts),
        "host_key_policy": policy,
    }
    entry.update(extra)
    return entry


def write_inventory(
    path: str | os.PathLike[str],
    server: SshServer,
    *,
    ctid: int | None = 200,
    target: str = "ct200",
    host: str = "pve1",
    policy: str = "strict",
    known_hosts: str | os.PathLike[str] | None = None,
    gpus: Iterable[int] = range(8),
    jump: str | None = None,
    extra_hosts: Mapping[str, Mapping[str, Any]] | None = None,
    extra_targets: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """Write an inventory with host `host` = `server` and target `target` on it; return the path.

    ctid=None makes a target that runs on the host itself. `extra_hosts`/`extra_targets` are
    merged in as given (e.g. a bastion for `jump`, or a second target on the same host).
    """
    hosts: dict[str, Any] = {host: host_entry(server, policy=policy, known_hosts=known_hosts)}
    if jump is not None:
        hosts[host]["jump"] = jump
    hosts.update({name: dict(entry) for name, entry in (extra_hosts or {}).items()})
    target_entry: dict[str, Any] = {"host": host}
    if ctid is not None:
        target_entry["ctid"] = ctid
    target_entry["gpus"] = list(gpus)
    targets: dict[str, Any] = {target: target_entry}
    targets.update({name: dict(entry) for name, entry in (extra_targets or {}).items()})
    out = Path(path)
    out.write_text(yaml.safe_dump({"hosts": hosts, "targets": targets}, sort_keys=False))
    return out


@contextlib.contextmanager
def silent_host(path: str | os.PathLike[str], server: SshServer, *, connect_timeout: float) -> Iterator[tuple[Path, SshServer]]:
    """An inventory with `server`'s pve1/ct200 and a second host, pve2 (ct300), whose sshd is frozen: the kernel
    accepts the connection, sshd never says a word. Yields (inventory, that host's server); stopped after."""
    hole = SshServer()
    hole.start()
    try:
        inv = write_inventory(path, server, extra_hosts={"pve2": host_entry(hole, connect_timeout=connect_timeout)},
                              extra_targets={"ct300": {"host": "pve2", "ctid": 300}})
        hole.freeze()
        yield Path(inv), hole
    finally:
        hole.stop()
