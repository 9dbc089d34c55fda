"""A play: one playbook on one target, with the door to its agent (a torchrun job over several targets is one
play per node, client/nodes.py)."""

from __future__ import annotations

import getpass
import os
import socket
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from gpuops.agent.wire.masking import Masker
from gpuops.client.door import Door
from gpuops.config.playbook_model import Playbook
from gpuops.targets import Inventory, Target
from gpuops.transport.base import Transport


@dataclass
class Play:
    inventory: Inventory
    playbook: Playbook
    target: Target
    transport: Transport
    node: Any = None  # client/nodes.Node: this job is one node of a torchrun job (launch.nodes)

    @property
    def local(self) -> bool:
        return self.inventory.hosts[self.target.host].transport == "local"

    @property
    def session(self) -> str:
        return self.playbook.launch.session

    @property
    def timeout(self) -> float:
        """Seconds for one short remote command."""
        return self.transport.command_timeout

    @property
    def run_gpus(self) -> tuple[int, ...]:
        """The GPUs a run of this playbook uses: those it checks and those it warms up."""
        gpus = list(self.playbook.preflight.gpus)
        if self.playbook.warmup:
            gpus += [g for g in self.playbook.warmup.gpus if g not in gpus]
        return tuple(gpus)

    @cached_property
    def door(self) -> Door:
        """The door to this target's agent: every tool a launch, a stop or a follow runs goes through it."""
        return Door(self.transport, label=self.target.name, mask=self.mask)

    @property
    def masker(self) -> Masker:
        return Masker(self.playbook.secrets)

    def mask(self, text: str) -> str:
        """Replace every secret value in text (error messages, output) with ***."""
        return self.masker(text)


def holder_id() -> str:
    """Who holds a lock: user@machine pid, and when."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
