"""A job: one playbook on one target, with the transport to reach it."""

from __future__ import annotations

import getpass
import os
import socket
import time
from dataclasses import dataclass

from gpuops.command import Cmd
from gpuops.config.model import Inventory, Target
from gpuops.config.playbook_model import Playbook
from gpuops.agent.wire.masking import Masker
from gpuops.transport.base import Result, Stream, Transport


@dataclass
class Job:
    inventory: Inventory
    playbook: Playbook
    target: Target
    transport: Transport
    _lib_ok: bool = False

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

    def run(self, cmd: Cmd, *, timeout: float | None = None, stdin: bytes | None = None) -> Result:
        """Run a command; a target tool that finds gpuops' target files missing gets them, then runs again."""
        from gpuops.client.remote import run_tool

        from gpuops.client.ship import ToolCmd

        result = run_tool(self.transport, cmd, timeout=timeout or self.timeout, label=self.target.name, stdin=stdin,
                          mask=self.mask)
        self._lib_ok = self._lib_ok or isinstance(cmd, ToolCmd)  # it ran: the files are there now
        return result

    def open(self, cmd: Cmd) -> Stream:
        """Start a streaming target tool (its files are made sure of first: a stream cannot be re-run)."""
        if not self._lib_ok:
            self.install_lib()
        return self.transport.open(cmd)

    def install_lib(self) -> None:
        """Copy gpuops' target package to the target unless its digest's folder is there already."""
        from gpuops.client.ship import install

        install(self.transport, timeout=max(self.timeout, 60.0), label=self.target.name, mask=self.mask)
        self._lib_ok = True

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
