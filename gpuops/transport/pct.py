"""An LXC container on a Proxmox host: wraps the host's transport with `pct exec <ctid> --`."""

from __future__ import annotations

import os
import re

from gpuops.agent.wire import protocol as p
from gpuops.command import Cmd, Script
from gpuops.errors import ContainerNotRunning
from gpuops.transport.base import Result, Stream, Transport, Wrapping

# pct's own words when the container is missing or stopped (REFERENCE.md).
_MISSING = re.compile(r"Configuration file '[^']*/lxc/(\d+)\.conf' does not exist")
_STOPPED = re.compile(r"Failed to get init pid|CT \d+ not running|container '?\d+'? not running|is not running")


class PctTransport(Wrapping):
    """Runs every command as `pct exec <ctid> -- argv` through the inner (host) transport; it is its own
    `container` (Transport.container: the state and pct's words, which only a container has)."""

    def __init__(self, inner: Transport, ctid: int) -> None:
        self.inner = inner
        self.ctid = ctid
        self.label = f"{inner.label}/ct{ctid}"

    @property
    def container(self) -> "PctTransport":
        return self

    def wrap(self, cmd: Cmd) -> Cmd:
        return self.inner.wrap(Cmd("pct", "exec", str(self.ctid), "--", *cmd.argv))

    def render(self, cmd: Cmd, *, display: bool = True) -> str:
        return self.inner.render(Cmd("pct", "exec", str(self.ctid), "--", *cmd.argv), display=display)

    def run(self, cmd: Cmd, *, timeout: float, stdin: bytes | None = None) -> Result:
        result = self.inner.run(Cmd("pct", "exec", str(self.ctid), "--", *cmd.argv), timeout=timeout, stdin=stdin)
        if result.exit_code != 0:
            self.raise_for_container(result.err)
        return result

    def run_with_state(self, cmd: Cmd, *, timeout: float, stdin: bytes | None = None) -> tuple[Result, str]:
        """One host script, as cheap as a raw `pct exec`: `pct status` runs only when the exec failed.
        The result is the exec's (its stderr merged into its stdout)."""
        result = self.inner.run(Cmd("bash", "-c", Script(_pct_exec_program()), "pct_exec", str(self.ctid), *cmd.argv),
                                timeout=timeout, stdin=stdin)
        return _split_exec_status(result)

    def open(self, cmd: Cmd) -> Stream:
        return self.inner.open(Cmd("pct", "exec", str(self.ctid), "--", *cmd.argv))

    def container_state(self, *, timeout: float) -> str:
        """`running`, `stopped`, `missing`, or pct's own words when it says something else."""
        result = self.inner.run(Cmd("pct", "status", str(self.ctid)), timeout=timeout)
        return parse_pct_status(result)

    def raise_for_container(self, stderr: str) -> None:
        """Turn pct's missing/stopped messages into a ContainerNotRunning error."""
        if _MISSING.search(stderr):
            raise ContainerNotRunning(
                f"{self.label}: container {self.ctid} does not exist on {self.inner.label}",
                hint="check `ctid` in the inventory (`pct list` on the host shows the containers)",
            )
        if _STOPPED.search(stderr):
            raise ContainerNotRunning(
                f"{self.label}: container {self.ctid} is not running",
                hint=f"start it with `pct start {self.ctid}` on {self.inner.label}",
            )


def parse_pct_status(result: Result) -> str:
    """Read `pct status` output: `status: running` -> running."""
    if result.exit_code == 0:
        m = re.search(r"^status:\s*(\S+)", result.out, re.M)
        if m:
            return m.group(1)
    if _MISSING.search(result.err):
        return "missing"
    text = (result.err or result.out).strip().splitlines()
    return text[-1] if text else f"unknown (pct status exited {result.exit_code})"


def _pct_exec_program() -> str:
    """The host-side program: the shellcheck-clean file pct_exec.sh beside this module, sent as `bash -c`'s program
    (it runs on the Proxmox host, not in the container: it is the transport's, not the agent's)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pct_exec.sh"), encoding="utf-8") as fh:
        return fh.read()


def _split_exec_status(result: Result) -> tuple[Result, str]:
    """The exec's own output and exit code, and the container's state: `running` when the exec
    worked, else what `pct status` said after it (its stdout and stderr were merged)."""
    reply = p.parse_pct_exec(result.out)
    if reply is None:
        return result, "running"
    state = parse_pct_status(Result(reply.status_rc, reply.status_said.encode(), reply.status_said.encode()))
    if state == "running":  # pct status says running, yet pct exec failed
        state = "running (but pct exec failed: " + " ".join(reply.exec_out.splitlines())[-200:] + ")"
    return Result(reply.exec_rc, reply.exec_out.encode(), result.stderr), state
