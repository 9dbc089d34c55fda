"""An LXC container on a Proxmox host: wraps the host's transport with `pct exec <ctid> --`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

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

    @property
    def host(self) -> Transport:
        return self.inner

    def from_host(self, cmd: Cmd) -> Cmd:
        return Cmd("pct", "exec", str(self.ctid), "--", *cmd.argv)

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


#: The lines pct_exec.sh prints after a failed `pct exec`: the exec's status, then (after `pct status`'s
#: output) pct status's own. The Proxmox host's, not the agent's: no gpuops file is shipped there.
EXEC_RC, STATUS_RC = "@@pct-exec-rc ", "@@pct-status-rc "


@dataclass
class PctExecReply:
    """pct_exec.sh's answer after a failed `pct exec`: the exec's status and output, then `pct status`'s."""

    exec_rc: int
    exec_out: str
    status_rc: int
    status_said: str


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.lstrip("-").isdigit() else None


def parse_pct_exec(text: str) -> PctExecReply | None:
    """pct_exec.sh's answer: None when the command ran in the container (its output is all of text)."""
    lines = text.splitlines(keepends=True)
    failed = [i for i, line in enumerate(lines) if line.startswith(EXEC_RC)]
    if not failed:
        return None
    head, after = lines[failed[0]], "".join(lines[failed[0] + 1:]).splitlines()
    exec_rc = _int(head[len(EXEC_RC):])
    status_rc = next((_int(line[len(STATUS_RC):]) for line in after if line.startswith(STATUS_RC)), None)
    said = "\n".join(line for line in after if not line.startswith(STATUS_RC))
    return PctExecReply(1 if exec_rc is None or exec_rc < 0 else exec_rc, "".join(lines[: failed[0]]),
                        1 if status_rc is None else status_rc, said)


def _split_exec_status(result: Result) -> tuple[Result, str]:
    """The exec's own output and exit code, and the container's state: `running` when the exec
    worked, else what `pct status` said after it (its stdout and stderr were merged)."""
    reply = parse_pct_exec(result.out)
    if reply is None:
        return result, "running"
    state = parse_pct_status(Result(reply.status_rc, reply.status_said.encode(), reply.status_said.encode()))
    if state == "running":  # pct status says running, yet pct exec failed
        state = "running (but pct exec failed: " + " ".join(reply.exec_out.splitlines())[-200:] + ")"
    return Result(reply.exec_rc, reply.exec_out.encode(), result.stderr), state
