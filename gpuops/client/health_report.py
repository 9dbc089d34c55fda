"""`gpuops health`'s reading of one target: every GPU's counters, slowdown reasons, link, temperatures, the host's
recent Xids, and a verdict per GPU (the wire's rules: agent/wire/verdict.py). One probe round trip to the
target and one to its host, side by side; a target that cannot be read is said, never hides the others."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuops.agent.wire.verdict import SERVICE, worst
from gpuops.client.door import Door
from gpuops.client.gpu_health import Health, HostXids, XidsSoon, verdicts
from gpuops.errors import ExitCode, GpuopsError
from gpuops.targets import Inventory, Target
from gpuops.transport import Pool


@dataclass
class TargetHealth:
    """One target's GPUs as read, or why they could not be."""

    target: str
    host: str
    ctid: int | None
    gpus: tuple[int, ...] | None = None  # the GPUs asked about (a playbook's); None: every GPU nvidia-smi lists
    window: float = 3600.0
    health: Health | None = None
    smi: str | None = None
    smi_error: str | None = None
    error: str | None = None
    error_code: int | None = None
    hint: str | None = None
    shown: list[int] = field(default_factory=list)

    @property
    def verdict(self) -> str | None:
        if self.health is None:
            return None
        levels = [self.health.verdicts[g].level for g in self.shown if g in self.health.verdicts]
        return worst(levels + [v.level for v in self.health.unplaced])

    @property
    def exit_code(self) -> int:
        """0: every GPU may run; 10: one needs a reset or service (the hardware); the error's code when unread."""
        if self.error_code is not None:
            return self.error_code
        return ExitCode.HARDWARE if self.verdict in ("needs reset", SERVICE) else ExitCode.OK

    def gpu_json(self, index: int) -> dict[str, Any]:
        assert self.health is not None
        v = self.health.verdicts[index]
        row = self.health.rows.get(index)
        base: dict[str, Any] = row.as_json() if row is not None else {"index": index, "bus_id": v.bus_id,
                                                                      "uuid": v.uuid, "lost": v.problems[0].value}
        xids = self.health.xids.on(v.bus_id)
        return {**base, "verdict": v.level, "problems": [p.as_json() for p in v.problems],
                "xids": [x.as_json() for x in xids]}

    def as_json(self) -> dict[str, Any]:
        xids = self.health.xids if self.health is not None else HostXids()
        gpus = [self.gpu_json(g) for g in self.shown] if self.health is not None else []
        gpus += [{"index": None, "bus_id": v.bus_id, "uuid": v.uuid, "lost": v.problems[0].value, "verdict": v.level,
                  "problems": [p.as_json() for p in v.problems], "xids": []}
                 for v in (self.health.unplaced if self.health is not None else [])]
        return {
            "target": self.target, "host": self.host, "ctid": self.ctid, "reachable": self.error is None,
            "error": self.error, "hint": self.hint, "verdict": self.verdict, "gpus": gpus,
            "nvidia_smi": self.smi, "nvidia_smi_error": self.smi_error,
            "refused_fields": list(self.health.refused) if self.health is not None else [],
            "kernel_log": None if self.health is None else {
                "reader": xids.reply.reader if xids.readable and xids.reply else None,
                "why": None if xids.readable else xids.why, "window": self.window},
        }


def read_target(pool: Pool, inventory: Inventory, target: Target, gpus: tuple[int, ...] | None,
                window: float) -> TargetHealth:
    """One target's GPUs and its host's Xids."""
    from gpuops.client.play import Play
    from gpuops.config.playbook_model import Launch, Playbook

    out = TargetHealth(target.name, target.host, target.ctid, gpus, window)
    try:
        transport = pool.target(target)
        play = Play(inventory, Playbook(path="", name="health", launch=Launch("health", "")), target, transport)
        soon = XidsSoon(play, window)
        probe = Door(transport, label=target.name).probe((), health=True)
        out.smi, out.smi_error = probe.smi, probe.smi_error
        xids = soon.result() or HostXids(error="not read")
        if probe.smi == "absent" or (probe.health is None and probe.smi == "error"):
            return out
        from gpuops.agent.wire.health import HealthReading

        out.health = verdicts(probe.health or HealthReading(), xids)
        out.health.refused = list(probe.health_refused)
        listed = sorted(out.health.verdicts)
        out.shown = [g for g in (gpus if gpus is not None else listed) if g in out.health.verdicts]
    except GpuopsError as exc:
        out.error, out.error_code, out.hint = str(exc), exc.exit_code, exc.hint
    return out
