"""The inventory as validated values (hosts, targets, groups): what the rest of gpuops reads, never raw YAML.
The configuration loader makes them (config/) and the transports connect to them (transport/): both stand on
this module, which imports nothing of gpuops but the position a value was written at. The playbook's values
are config/playbook_model.py's, so a command that reads only an inventory (status, logs, stop) does not
import the playbook's sections and the agent defaults they take."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, Mapping

from gpuops.position import Mark


@dataclass(frozen=True)
class Host:
    """A machine gpuops reaches: this one (local) or an SSH host."""

    name: str
    transport: Literal["ssh", "local"] = "ssh"
    address: str | None = None  # None: the host's name, resolved through ~/.ssh/config
    user: str | None = None  # None: ~/.ssh/config, else the local user
    port: int | None = None  # None: ~/.ssh/config, else 22
    identity_file: str | None = None  # None: ssh-agent and ~/.ssh/config
    known_hosts: str | None = None  # None: UserKnownHostsFile from ~/.ssh/config, else ~/.ssh/known_hosts
    # None: as ssh resolves StrictHostKeyChecking (accept-new there is accept-new; anything else is strict)
    host_key_policy: Literal["strict", "accept-new"] | None = None
    jump: str | None = None  # another host of the same inventory (ProxyJump)
    ssh_args: tuple[str, ...] = ()  # ssh command-line options (Ansible's ssh args), resolved by `ssh -G ARGS HOST`
    connect_timeout: float = 10.0  # seconds for TCP connect, banner and auth, each
    command_timeout: float = 60.0  # seconds for one short remote command
    mark: Mark | None = None


@dataclass(frozen=True)
class Target:
    """Where commands run: a host, or an LXC container on it when ctid is set."""

    name: str
    host: str
    ctid: int | None = None
    gpus: tuple[int, ...] = ()
    mark: Mark | None = None
    # Who runs the job there (Ansible's become): None is the login user (root in a container). In a container
    # gpuops becomes with runuser (pct exec is root there); on a host with sudo (-H -n) or su (become_method).
    become_user: str | None = None
    become_method: Literal["sudo", "su"] = "sudo"
    rdzv_address: str | None = None  # how the other nodes of a torchrun job reach this one (docs/torchrun.md)


@dataclass(frozen=True)
class Inventory:
    """Hosts and targets of one inventory file."""

    path: str
    hosts: Mapping[str, Host]
    targets: Mapping[str, Target]
    # group -> the names of its targets, its child groups' included (Ansible inventories; -t GROUP)
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # target -> why it cannot be used (a Jinja template in its values): only that target fails, when used, with
    # this error (a gpuops.errors.ConfigError, raised as it is)
    broken: Mapping[str, Exception] = field(default_factory=lambda: MappingProxyType({}))
