"""A job: one playbook on one target, with the transport to reach it."""

from __future__ import annotations

import getpass
import os
import socket
import time
from dataclasses import dataclass

from gpuops.command import MASK, Cmd
from gpuops.config.model import Inventory, Playbook, Target
from gpuops.transport.base import Result, Transport


@dataclass
class Job:
    inventory: Inventory
    playbook: Playbook
    target: Target
    transport: Transport

    @property
    def local(self) -> bool:
        return self.inventory.hosts[self.target.host].transport == "local"

    @property
    def session(self) -> str:
        return self.playbook.launch.session

    @property
    def timeout(self) -> float:
        """Seconds for one short remote command."""
        host = self.inventory.hosts[self.target.host]
        return getattr(host, "command_timeout", 60.0)

    @property
    def run_gpus(self) -> tuple[int, ...]:
        """The GPUs a run of this playbook uses: those it checks and those it warms up."""
        gpus = list(self.playbook.preflight.gpus)
        if self.playbook.warmup:
            gpus += [g for g in self.playbook.warmup.gpus if g not in gpus]
        return tuple(gpus)

    def run(self, cmd: Cmd, *, timeout: float | None = None, stdin: bytes | None = None) -> Result:
        return self.transport.run(cmd, timeout=timeout or self.timeout, stdin=stdin)

    def mask(self, text: str) -> str:
        """Replace every secret value in text (error messages, output) with ***."""
        for secret in self._masked:
            text = text.replace(secret, MASK)
        return text

    @property
    def _masked(self) -> list[str]:
        """The secrets, and each line of a multi-line one (output is shown line by line), longest first."""
        parts: set[str] = set()
        for secret in self.playbook.secrets:
            parts.add(secret)
            for line in secret.splitlines():
                parts.update((line, line.strip()))
        return sorted((p for p in parts if len(p) >= 3), key=len, reverse=True)


def holder_id() -> str:
    """Who holds a lock: user@machine pid, and when."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
