"""Xid lines of the NVIDIA kernel driver: parsed, tied to a GPU by its PCI bus id, and classified by NVIDIA's
Xid catalog (xid_catalog.json beside this module: each Xid's name, meaning and resolution, its sources named
in the file). Pure and standard library only: the host's kernel-log tools classify with it, the client and
the watchdog read what they said.

The line, as the driver prints it (open-gpu-kernel-modules kernel_rc.c; real lines in
/work/notes/research/health-notes.md and tests/test_xid.py): ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234,
name=python3, GPU has fallen off the bus.`` R570 and later leave out ``pid=``/``name=`` when unknown, R515-R565
print ``pid='<unknown>', name=<unknown>``, a MIG instance adds `` GPU-I:05`` inside the parentheses, and each
reader adds its own prefix (``[  219.470994] ``, ``2025-01-21T04:41:44,283575+00:00 ``, ``host kernel: ``):
the line is found by ``NVRM: Xid (`` anywhere in it. The address is domain:bus:device in lower-case hex with
no function; nvidia-smi prints the same GPU as ``00000000:3B:00.0``: ``bus_key`` reads both as ``0000:3b:00``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

__all__ = ["ACTIONS", "LEVELS", "XidEvent", "XidInfo", "bus_key", "catalog", "classify", "info", "level_of",
           "needs_reset", "parse_line"]

CATALOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xid_catalog.json")

_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-9a-fA-F])?(?: [^)]*)?\): "
    r"(?P<code>\d+)(?:, (?P<rest>.*))?$")
_PID = re.compile(r"^pid=('?<unknown>'?|\d+), ")
_NAME = re.compile(r"^name=(<unknown>|[^,]*), ")
_BUS = re.compile(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-9a-fA-F])?$")
#: Xid 154's text names the recovery action it changed to (driver 595 gpu.c, `_gpuRecoveryActionName`).
_TO_ACTION = re.compile(r"to 0x[0-9a-fA-F]+ \(([^)]*)\)")
_RECOVERY = {"None": "ignore", "GPU Reset Required": "reset_gpu", "Node Reboot Required": "reboot",
             "Drain and Reset": "reset_gpu", "Drain P2P": "reset_gpu"}

#: What each resolution of the catalog asks of the operator, in words a message carries.
ACTIONS = {
    "ignore": "no action needed (NVIDIA's Xid catalog)",
    "restart_app": "restart the application; the GPU stays usable (NVIDIA's Xid catalog)",
    "reset_gpu": "reset the GPU before a run uses it again (nvidia-smi -r -i BUS on the host, with no process "
                 "on it; NVIDIA's Xid catalog: RESET_GPU)",
    "reboot": "reboot the host (NVIDIA's Xid catalog: restart bare metal); if it comes back, contact NVIDIA support",
    "contact_support": "take the GPU out of service and contact NVIDIA support (NVIDIA's Xid catalog)",
    "check_hardware": "check the GPU's seating and its power and PCIe connections (NVIDIA's Xid catalog)",
    "unknown": "not in NVIDIA's Xid catalog as gpuops ships it: see docs.nvidia.com/deploy/xid-errors/",
}
#: A GPU's verdict, from best to worst (wire/verdict.py uses the same words).
OK, WARN, RESET, SERVICE = "ok", "warn", "needs reset", "needs service"
LEVELS = (OK, WARN, RESET, SERVICE)
_LEVEL = {"ignore": OK, "restart_app": WARN, "unknown": WARN, "reset_gpu": RESET, "reboot": RESET,
          "contact_support": SERVICE, "check_hardware": SERVICE}


def level_of(resolution: str) -> str:
    """How bad a resolution is for the GPU: ok, warn (the application's), needs reset, needs service."""
    return _LEVEL.get(resolution, WARN)


def needs_reset(resolution: str) -> bool:
    """Whether a GPU that took it must be reset (or more) before a run may use it again."""
    return level_of(resolution) in (RESET, SERVICE)


def bus_key(text: str) -> Optional[str]:
    """A PCI address in any of its spellings (`00000000:3B:00.0`, `0000:3b:00`, `3b:00.0`) as `0000:3b:00`."""
    m = _BUS.search((text or "").strip())
    if m is None:
        return None
    domain = (m.group(1) or "0")[-4:].rjust(4, "0")
    return ("%s:%s:%s" % (domain, m.group(2), m.group(3))).lower()


@dataclass(frozen=True)
class XidInfo:
    """What NVIDIA's catalog says of one Xid."""

    code: int
    name: str
    meaning: str
    resolution: str  # ignore | restart_app | reset_gpu | reboot | contact_support | check_hardware | unknown
    hardware: bool  # the GPU, its firmware, driver or bus, rather than the application

    @property
    def action(self) -> str:
        return ACTIONS.get(self.resolution, ACTIONS["unknown"])

    @property
    def level(self) -> str:
        return level_of(self.resolution)


_catalog: Dict[str, Any] = {}


def catalog() -> Dict[str, Any]:
    """The shipped catalog (read once): `source` (where it was read), `xids` (code -> entry)."""
    if not _catalog:
        with open(CATALOG, encoding="utf-8") as fh:
            _catalog.update(json.load(fh))
    return _catalog


def info(code: int) -> XidInfo:
    """The catalog's entry for an Xid; one it does not list is `unknown` (a warning, never a reset by guess)."""
    entry = catalog().get("xids", {}).get(str(int(code)))
    if not isinstance(entry, dict):
        return XidInfo(int(code), "Xid %d" % code, "not in NVIDIA's Xid catalog as gpuops ships it", "unknown", False)
    return XidInfo(int(code), str(entry.get("name") or "Xid %d" % code), str(entry.get("meaning") or ""),
                   str(entry.get("resolution") or "unknown"), bool(entry.get("hardware")))


def classify(code: int, message: str = "") -> XidInfo:
    """The catalog's entry, read with the line's own words where the catalog says to: Xid 154 names the
    recovery action it changed to; an ECC error line saying `RST: Yes` or `D-RST: Yes` needs a reset."""
    found = info(code)
    resolution = found.resolution
    if code == 154:
        m = _TO_ACTION.search(message)
        if m and m.group(1) in _RECOVERY:
            resolution = _RECOVERY[m.group(1)]
    if ("RST: Yes" in message or "D-RST: Yes" in message) and not needs_reset(resolution):
        resolution = "reset_gpu"
    return found if resolution == found.resolution else XidInfo(found.code, found.name, found.meaning, resolution,
                                                                True)


@dataclass(frozen=True)
class XidEvent:
    """One Xid line: the GPU's bus (`0000:3b:00`), the Xid, the process the driver named, its message, when (the
    kernel log's clock, seconds since the epoch; None when the reader gave none) and the line as read."""

    bus: str
    code: int
    message: str
    line: str
    pid: Optional[int] = None
    process: Optional[str] = None
    t: Optional[float] = None

    @property
    def info(self) -> XidInfo:
        return classify(self.code, self.message)

    def as_json(self) -> Dict[str, Any]:
        """The event as the host's tools hand it on: the line's facts and the catalog's."""
        found = self.info
        return {**asdict(self), "name": found.name, "meaning": found.meaning, "resolution": found.resolution,
                "hardware": found.hardware, "action": found.action, "level": found.level}


def parse_line(line: str, t: Optional[float] = None) -> Optional[XidEvent]:
    """The Xid in one kernel-log line (any reader's prefix), or None when it holds none."""
    at = line.find("NVRM: Xid (")
    if at < 0:
        return None
    m = _LINE.match(line[at:].rstrip("\r\n"))
    if m is None:
        return None
    bus = bus_key(m.group("bus"))
    if bus is None:
        return None
    rest, pid, process = m.group("rest") or "", None, None
    got = _PID.match(rest)
    if got:
        pid = int(got.group(1)) if got.group(1).isdigit() else None
        rest = rest[got.end():]
    got = _NAME.match(rest)
    if got:
        process = None if got.group(1) == "<unknown>" else got.group(1)
        rest = rest[got.end():]
    return XidEvent(bus, int(m.group("code")), rest.strip(), line[at:].strip(), pid, process, t)
