"""The GPUs' own health, the client's side: the verdict on each GPU (preflight's refusal, `gpuops health`), the
host's recent Xids, and the host's kernel-log follower started for a run (docs/health.md).

The judging is the wire's (agent/wire/verdict.py, agent/wire/xid.py): this module gathers what it needs (the
probe's health fields, the host's `xids`) and words what it found.
"""

from __future__ import annotations

import calendar
import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from gpuops.agent.wire.health import GpuHealth, HealthReading, LostGpu
from gpuops.agent.wire.hostwire import XidsReply
from gpuops.agent.wire.verdict import RESET, SERVICE, Verdict, judge, judge_lost
from gpuops.agent.wire.xid import XidEvent, bus_key
from gpuops.client.door import Door, commands
from gpuops.client.events import Event
from gpuops.client.play import Play
from gpuops.errors import GpuopsError

#: Where the verdicts that keep a run off a GPU are named in a refusal.
HINT = ("a playbook that does not use these GPUs can run now (preflight.gpus, warmup.gpus); preflight.health: warn "
        "starts this one anyway (docs/health.md)")


def host_door(play: Play) -> Door:
    """The door to the host that logs the target's GPU errors: the Proxmox host of a container, the target itself
    otherwise (as the target's transport reaches it)."""
    container = play.transport.container
    if container is None:
        return play.door
    return Door(container.host, label=f"{container.host.label} (the host of {play.target.name})", mask=play.mask)


@dataclass
class HostXids:
    """The host's recent Xids as read (reply), or why they could not be (error)."""

    reply: XidsReply | None = None
    error: str | None = None

    @property
    def readable(self) -> bool:
        return self.reply is not None and self.reply.readable

    @property
    def why(self) -> str:
        return self.error or (self.reply.why if self.reply is not None else "not read")

    def on(self, bus: str | None) -> list[XidEvent]:
        """The Xids on the GPU with this bus (`0000:3b:00`, or nvidia-smi's spelling)."""
        key = bus_key(bus or "")
        return [x for x in (self.reply.xids if self.reply else []) if key and x.bus == key]


def read_host_xids(play: Play, window: float) -> HostXids:
    """The host's Xids of the last `window` seconds; never raises (a host that cannot be read is said, not fatal)."""
    try:
        return HostXids(host_door(play).xids(window))
    except GpuopsError as exc:
        return HostXids(error=str(exc))


class XidsSoon:
    """The host's Xids read in a thread, beside the launch lock's round trip (None window: not read)."""

    def __init__(self, play: Play, window: float | None) -> None:
        import threading

        self.got: HostXids | None = None
        self.thread = None if window is None else threading.Thread(
            target=lambda: setattr(self, "got", read_host_xids(play, window)), name="gpuops-xids", daemon=True)
        if self.thread is not None:
            self.thread.start()

    def result(self) -> HostXids | None:
        if self.thread is None:
            return None
        self.thread.join()
        return self.got


@dataclass
class Health:
    """Each GPU's verdict on one target, and the host's Xids that went into them."""

    verdicts: dict[int, Verdict] = field(default_factory=dict)
    unplaced: list[Verdict] = field(default_factory=list)  # lost GPUs whose index cannot be told
    rows: dict[int, GpuHealth] = field(default_factory=dict)
    xids: HostXids = field(default_factory=HostXids)
    refused: list[str] = field(default_factory=list)  # health fields this driver does not know

    def blocking(self, gpus: Iterable[int]) -> list[Verdict]:
        """The verdicts that keep a run off these GPUs (a lost GPU that cannot be placed, where one of them is
        missing from nvidia-smi's table)."""
        wanted = list(gpus)
        bad = [self.verdicts[g] for g in wanted if g in self.verdicts and self.verdicts[g].blocking]
        return bad + (self.unplaced if any(g not in self.verdicts for g in wanted) else [])


def lost_indexes(reading: HealthReading) -> list[tuple[int | None, LostGpu]]:
    """Each lost GPU with the index nvidia-smi would give it: indexes follow PCI order, so the missing ones, in
    order, are the lost bus ids, in order (None where that does not add up)."""
    present = {g.index for g in reading.gpus}
    total = len(reading.gpus) + len(reading.lost)
    missing = sorted(set(range(total)) - present)
    lost = sorted(reading.lost, key=lambda x: bus_key(x.bus_id or "") or "")
    if len(missing) != len(lost):
        return [(None, x) for x in lost]
    return list(zip(missing, lost, strict=True))


def verdicts(reading: HealthReading, xids: HostXids) -> Health:
    """Every GPU's verdict: its row and its Xids, or the line nvidia-smi printed for it."""
    health = Health(xids=xids)
    for row in reading.gpus:
        health.rows[row.index] = row
        health.verdicts[row.index] = judge(row, xids.on(row.bus))
    for index, lost in lost_indexes(reading):
        verdict = judge_lost(lost, index, None, xids.on(lost.bus_id))
        if index is None:
            health.unplaced.append(verdict)
        else:
            health.verdicts[index] = verdict
    return health


def refusal(play: Play, bad: Sequence[Verdict]) -> str:
    """The preflight message: each GPU, what is wrong with it, NVIDIA's recommended action."""
    parts = []
    for v in bad:
        causes = "; ".join(f"{p.counter} = {p.value}: {p.message}; NVIDIA: {p.action}" for p in v.blocking)
        parts.append(f"{v.names()} {v.level}: {causes}")
    return f"{play.target.name}: " + " | ".join(parts)


def gpu_event(play: Play, v: Verdict, *, blocking_too: bool = False) -> Event:
    """A GPU's warnings (and, with preflight.health: warn, what would have refused it) as a `gpu_health` event."""
    problems = v.problems if blocking_too else v.warnings
    return Event("gpu_health", play.target.name, None, {"gpu": v.index, "bus_id": v.bus_id, "uuid": v.uuid,
                                                         "verdict": v.level, "problems": [p.as_json() for p in problems]})


def gpu_ids(health: Health, gpus: Iterable[int]) -> dict[str, dict[str, Any]]:
    """The run's GPUs by the kernel log's bus (`0000:9a:00`): their index, bus id and UUID (the follower's spec)."""
    out = {}
    for g in gpus:
        row = health.rows.get(g)
        if row is not None and row.bus:
            out[row.bus] = {"index": g, "bus_id": row.bus_id, "uuid": row.uuid}
    return out


def start_host_watch(play: Play, run_id: str, health: Health | None, since: float) -> Iterator[Event]:
    """The host's kernel-log follower for the run (watch.host_kernel_log: auto), where the host can read its
    kernel log; a `host_kernel_log` event says what it does (following, or off and why)."""
    name = play.target.name
    if play.playbook.watch.host_kernel_log == "off" or not play.run_gpus:
        return
    if health is None or not health.xids.readable:
        why = health.xids.why if health is not None else "the GPUs' bus ids were not read"
        yield Event("host_kernel_log", name, run_id, {"state": "off", "why": why})
        return
    gpus = gpu_ids(health, play.run_gpus)
    container = play.transport.container
    link = commands.host_link(run_id)
    argv = (container.from_host(link) if container is not None else link).words()
    spec = {"run": run_id, "window": round(time.monotonic() - since + 60.0, 1), "gpus": gpus, "link": argv}
    try:
        reply = host_door(play).host_watch(json.dumps(spec).encode() + b"\n")
    except GpuopsError as exc:
        yield Event("host_kernel_log", name, run_id, {"state": "off", "why": str(exc)})
        return
    if reply.off is not None:
        yield Event("host_kernel_log", name, run_id, {"state": "off", "why": reply.off})
        return
    yield Event("host_kernel_log", name, run_id, {"state": "following", "reader": reply.reader, "host_pid": reply.pid,
                                                  "gpus": sorted(g["index"] for g in gpus.values())})


#: What a run's end is called when an Xid explains it.
ENDINGS = {"stall": "stall", "failed": "crash", "lost": "lost run"}


def explain_end(play: Play, run_id: str, info: Any, how: str) -> dict[str, Any] | None:
    """A stall, crash or lost run this client followed, whose host follower handed no Xid over (it stopped, or the
    run's watchdog was gone): the host's kernel log read for the run's time window; an Xid that needs a reset on a
    run GPU is the run's end (hardware.json, written). None when there is none, or nothing to read it with."""
    said = info.meta.get("host_kernel_log") if isinstance(info.meta.get("host_kernel_log"), dict) else {}
    died = "follower ended" in str((info.host_log_end or {}).get("why"))  # the host's follower stopped mid-run
    if info.hardware is not None or not play.run_gpus or said.get("state") in (None, "off") or (
            info.host_log is not None and not died):  # it followed to the end: the watchdog judged what it saw
        return None
    try:
        since = calendar.timegm(time.strptime(str(info.meta.get("started_at")), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return None
    xids = read_host_xids(play, max(60.0, time.time() - since + 120.0))
    try:
        rows = (play.door.probe((play.session,), health=True).health or HealthReading()).by_index()
    except GpuopsError:
        return None
    buses = {rows[g].bus: rows[g] for g in play.run_gpus if g in rows and rows[g].bus}
    grave = [x for x in (xids.reply.xids if xids.readable and xids.reply else []) if x.bus in buses
             and x.info.level in (RESET, SERVICE)]
    if not grave:
        return None
    x, row = grave[0], buses[grave[0].bus]
    record = {"rule": "gpu-xid", "gpu": row.identity(), "counter": None, "value": None,
              "xid": {"code": x.code, "name": x.info.name, "resolution": x.info.resolution, "line": x.line, "t": x.t},
              "message": f"Xid {x.code} ({x.info.name}) on GPU {row.index} in the host's kernel log: the "
                         f"{ENDINGS.get(how, how)} is reported as the Xid (read by the following client)",
              "action": x.info.action.replace("BUS", row.bus_id or "its bus id"), "instead_of": how,
              "time": round(time.time(), 3)}
    try:
        play.door.record(run_id, "hardware.json", record)
    except GpuopsError:
        pass
    return record


def meta_state(play: Play, health: Health | None) -> dict[str, Any] | None:
    """meta.json's `host_kernel_log` (status shows it): the playbook's mode and, where it will not follow, why;
    None for a run without GPUs (nothing to follow)."""
    mode = play.playbook.watch.host_kernel_log
    if not play.run_gpus:
        return None
    if mode == "off":
        return {"mode": mode, "state": "off", "why": "watch.host_kernel_log: off"}
    if health is None or not health.xids.readable:
        return {"mode": mode, "state": "off", "why": health.xids.why if health else "the GPUs' bus ids were not read"}
    return {"mode": mode, "state": "starting"}


__all__ = ["HINT", "Health", "HostXids", "RESET", "SERVICE", "gpu_event", "gpu_ids", "host_door", "lost_indexes",
           "meta_state", "read_host_xids", "refusal", "start_host_watch", "verdicts"]
