"""Status of many targets in parallel: one round trip each, one dead host never hides the others."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpuops.command import Cmd, Raw, Script, bash
from gpuops.config.model import Inventory, Target
from gpuops.errors import GpuopsError
from gpuops.probe import MARK, Probe, parse_probe, probe_script
from gpuops.transport import Pool
from gpuops.transport.pct import PctTransport

MAX_PARALLEL = 8


@dataclass
class TargetStatus:
    target: str
    host: str
    ctid: int | None
    reachable: bool = False
    error: str | None = None
    error_code: int | None = None
    container: str | None = None
    probe: Probe | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        probe = self.probe
        return {
            "target": self.target,
            "host": self.host,
            "ctid": self.ctid,
            "reachable": self.reachable,
            "error": self.error,
            "container": self.container,
            "nvidia_smi": probe.smi if probe else None,
            "nvidia_smi_error": probe.smi_error if probe else None,
            "gpus": [g.as_json() for g in probe.gpus] if probe else [],
            "sessions": [
                {
                    "session": s.session,
                    "alive": s.alive,
                    "launch_in_progress": s.locked_by,
                    "run": s.run.as_json() if s.run else None,
                }
                for s in (probe.sessions.values() if probe else [])
            ],
        }


def probe_target(pool: Pool, inventory: Inventory, target: Target, sessions: tuple[str, ...] | None) -> TargetStatus:
    """Everything about one target in one round trip (pct status and pct exec in one host script)."""
    status = TargetStatus(target.name, target.host, target.ctid)
    started = time.monotonic()
    transport = pool.target(target)
    timeout = getattr(inventory.hosts[target.host], "command_timeout", 60.0)
    try:
        if isinstance(transport, PctTransport):
            ct = str(target.ctid)
            host_script = Script(
                Cmd("pct", "status", ct) + [Raw("2>&1")],
                f'echo "{MARK}pct_rc $?"',
                Cmd("pct", "status", ct) + [Raw("2>/dev/null | grep -q '^status: running' || exit 0")],
                Cmd("pct", "exec", ct, "--", *bash(probe_script(sessions)).argv),
            )
            result = transport.inner.run(bash(host_script), timeout=timeout)
            status.container = _container_state(result.out)
            status.reachable = True
            if status.container == "running":
                status.probe = parse_probe(result.out)
        else:
            result = transport.run(bash(probe_script(sessions)), timeout=timeout)
            status.reachable = True
            status.probe = parse_probe(result.out)
    except GpuopsError as exc:
        status.error = str(exc)
        status.error_code = exc.exit_code
    status.seconds = time.monotonic() - started
    return status


def _container_state(out: str) -> str:
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(MARK + "pct_rc"):
            rc = line.split()[-1]
            before = [ln for ln in lines[:i] if ln.strip()]
            for text in before:
                if text.startswith("status:"):
                    return text.split(":", 1)[1].strip()
            if "does not exist" in " ".join(before):
                return "missing"
            return f"unknown (pct status exited {rc}: {' '.join(before)[:200]})"
    return "unknown"


def gather(pool: Pool, inventory: Inventory, targets: list[Target], sessions: tuple[str, ...] | None) -> list[TargetStatus]:
    """Probe every target, at most MAX_PARALLEL at a time; results in the order asked."""
    if len(targets) == 1:
        return [probe_target(pool, inventory, targets[0], sessions)]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(targets))) as ex:
        futures = [ex.submit(probe_target, pool, inventory, t, sessions) for t in targets]
        return [f.result() for f in futures]
