"""A run ended by its hardware: the record that says which GPU and why (hardware.json), the stall or crash an Xid
explains, and the restart that never starts on a GPU that needs a reset.

hardware.json (protocol.HARDWARE, one per attempt) makes the outcome `hardware`, exit 10 (records.outcome):
`rule` (gpu-xid, gpu-ecc, gpu-lost, gpu-slowdown), `gpu` (index, bus_id, uuid), `xid` (code, name, resolution,
line, t) or `counter` and `value`, `message`, `action` (NVIDIA's), `instead_of` (stall, failed, lost: what the
run would have been reported as), `restart_blocked` (why the restart `restart.on` asked for did not start).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol

from ..wire import protocol as p
from ..wire.detector_list import hardware_rules
from ..wire.records import read_json, write_json_atomic
from ..wire.verdict import judge as verdict
from ..wire.verdict import judge_lost
from ..wire.xid import RESET, SERVICE

if TYPE_CHECKING:
    from ..wire.watchfile import WatchConfig
    from .quiet_failures import Quiet


class Events(Protocol):
    def write(self, event: str, **data: Any) -> None: ...


class Watched(Protocol):
    """What a run's end reads of the watchdog (watch/watchdog.Watchdog): its run, its samples and its events."""

    d: str
    cfg: WatchConfig
    started: float
    quiet: Quiet

    @property
    def events(self) -> Events: ...  # read only, so the watchdog's EventLog is one

#: Seconds the end of a crashed or lost attempt waits for the host's follower to hand over an Xid (it reads the
#: kernel log as it is written: a GPU that fell off the bus fails the training before the Xid is through).
GRACE = 2.0
#: An Xid this many seconds before the attempt started still explains its end (the launch, the warmup).
BEFORE = 120.0


def read(d: str) -> Optional[Dict[str, Any]]:
    return read_json(os.path.join(d, p.HARDWARE))


def write(d: str, record: Dict[str, Any]) -> Dict[str, Any]:
    write_json_atomic(os.path.join(d, p.HARDWARE), record)
    return record


def _gpu(figures: Dict[str, Any]) -> Dict[str, Any]:
    return {"index": figures.get("gpu"), "bus_id": figures.get("bus_id"), "uuid": figures.get("uuid")}


def from_finding(f: Any, instead_of: Optional[str] = None) -> Dict[str, Any]:
    """The record of a gpu-* finding that ends the run."""
    fig = f.figures
    xid = None if fig.get("xid") is None else {k: fig.get(k) for k in ("name", "resolution", "line", "t")}
    if xid is not None:
        xid["code"] = fig.get("xid")
    return {"rule": f.rule, "gpu": _gpu(fig), "xid": xid, "counter": fig.get("counter"), "value": fig.get("value"),
            "message": f.message, "action": f.advice, "instead_of": instead_of, "time": round(time.time(), 3)}


def is_hardware(f: Any) -> bool:
    return f.rule in hardware_rules()


def grave_xids(wd: Watched, since: Optional[float]) -> List[Dict[str, Any]]:
    """The Xids that need a reset or more on the run's GPUs, from the host's follower, at or after `since`."""
    wd.quiet.host.take()  # what came since the last tick
    out = []
    for r in wd.quiet.host.log.xids:
        t = r.get("t")
        if r.get("level") in (RESET, SERVICE) and r.get("index") in wd.cfg.gpus and (
                since is None or not isinstance(t, (int, float)) or t >= since):
            out.append(r)
    return out


def _xid_finding(r: Dict[str, Any], instead_of: str) -> Dict[str, Any]:
    from .gpu_xid import words

    ended = {"stall": "the stall is reported as the Xid", "failed": "the crash is reported as the Xid",
             "lost": "the lost run is reported as the Xid"}.get(instead_of, "no restart onto it")
    message = "%s in the host's kernel log: %s" % (words(r), ended)
    return {"rule": "gpu-xid", "gpu": {"index": r.get("index"), "bus_id": r.get("bus_id"), "uuid": r.get("uuid")},
            "xid": {"code": r.get("code"), "name": r.get("name"), "resolution": r.get("resolution"),
                    "line": r.get("line"), "t": r.get("t")}, "counter": None, "value": None, "message": message,
            "action": str(r.get("action") or "").replace("BUS", str(r.get("bus_id") or "its bus id")),
            "instead_of": instead_of, "time": round(time.time(), 3)}


def explain(wd: Watched, instead_of: str, wait: bool) -> Optional[Dict[str, Any]]:
    """A stall, crash or lost session whose window holds an Xid that needs a reset on a GPU of the run: its record
    (written), or None. `wait`: give the host's follower GRACE seconds to hand one over first."""
    if read(wd.d) is not None:
        return None
    since = wd.started - BEFORE
    found = grave_xids(wd, since)
    follower = wd.quiet.host.log
    deadline = time.monotonic() + GRACE
    while not found and wait and follower.following is not None and follower.ended is None \
            and time.monotonic() < deadline:
        time.sleep(0.1)
        found = grave_xids(wd, since)
    if not found:
        return None
    record = write(wd.d, _xid_finding(found[0], instead_of))
    wd.events.write("hardware", message=record["message"], rule="gpu-xid", figures={
        "gpu": record["gpu"]["index"], "bus_id": record["gpu"]["bus_id"], "uuid": record["gpu"]["uuid"],
        "xid": record["xid"]["code"], "instead_of": instead_of}, advice=record["action"])
    return record


def blocks_restart(wd: Watched) -> Optional[Dict[str, Any]]:
    """Why no restart may start on the run's GPUs (a record, written), or None: the attempt ended by its hardware,
    an Xid that needs a reset on one of them since the run started, or the last health sample's verdict."""
    record = read(wd.d)
    if record is None:
        xids = grave_xids(wd, None)
        if xids:
            record = _xid_finding(xids[0], "restart")
        else:
            record = _health_block(wd)
    if record is None:
        return None
    gpu = record.get("gpu") or {}
    record["restart_blocked"] = "no restart: GPU %s (%s) %s; %s" % (
        gpu.get("index"), ", ".join(str(x) for x in (gpu.get("bus_id"), gpu.get("uuid")) if x),
        "took Xid %s (%s)" % (record["xid"]["code"], record["xid"]["name"]) if record.get("xid") else
        "needs a reset: " + str(record.get("message")), record.get("action"))
    return write(wd.d, record)


def _health_block(wd: Watched) -> Optional[Dict[str, Any]]:
    sample = wd.quiet.health
    if sample is None:
        return None
    for index in sorted(sample.rows):
        if index not in wd.cfg.gpus:
            continue
        v = verdict(sample.rows[index])
        if v.blocking:
            problem = v.blocking[0]
            rule = "gpu-lost" if problem.counter in sample.rows[index].errors else "gpu-ecc"
            return {"rule": rule, "gpu": {"index": index, "bus_id": v.bus_id, "uuid": v.uuid}, "xid": None,
                    "counter": problem.counter, "value": problem.value, "message": problem.message,
                    "action": problem.action, "instead_of": "restart", "time": round(time.time(), 3)}
    for lost in sample.lost:
        problem = judge_lost(lost).problems[0]
        return {"rule": "gpu-lost", "gpu": {"index": None, "bus_id": lost.bus_id, "uuid": None}, "xid": None,
                "counter": problem.counter, "value": None, "message": problem.message, "action": problem.action,
                "instead_of": "restart", "time": round(time.time(), 3)}
    return None
