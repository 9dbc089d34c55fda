"""A GPU's verdict from its health fields and the host's Xids: ok, warn (it only slows a run), needs reset, needs
service, each cause named with its counter and NVIDIA's recommended action. Pure and standard library only:
preflight, `gpuops health` and the watchdog's restart gate judge with the same rules.

The rules and where each comes from (/work/notes/research/health-notes.md, sections 1, 4, 5):
- `gpu_recovery_action` other than None: the driver's own word (nvidia-smi docs: Reset, Reboot, Drain P2P,
  Drain and Reset); an unknown value needs attention too.
- A field the driver answers with an error (`[GPU requires reset]`, `[Unknown Error]`), a GPU nvidia-smi cannot
  open (`Unable to determine the device handle`): the GPU is not usable until it is reset or the host rebooted.
- Uncorrected ECC errors since the driver loaded (volatile): reset the GPU before a run uses it (Xid 48's
  trigger text: "A GPU reset or node reboot is needed to clear this error").
- A row remap pending: "GPU reset is required to complete row remapping" (nvidia-smi's help); a remap that
  failed: NVIDIA's RMA criterion (GPU memory error management, RMA policy).
- Retired pages pending, on GPUs that retire pages rather than remap rows: reset or reload the driver.
- An Xid on the GPU: its catalog resolution (wire/xid.py).
- A hardware, thermal or power-brake slowdown, a PCIe link narrower than its maximum, a very hot GPU: a
  warning (the run would be slow, not wrong). The link's generation drops when a GPU idles; its width does
  not on the lent H100 (5/16 at idle): only the width is judged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional

from .health import SLOWDOWN, GpuHealth, LostGpu, reasons
from .xid import LEVELS, OK, RESET, SERVICE, WARN, XidEvent

__all__ = ["HOT_GPU_C", "HOT_MEMORY_C", "OK", "Problem", "RESET", "SERVICE", "Verdict", "WARN", "judge", "judge_lost",
           "worst"]

#: A GPU at or above these temperatures is warned about (H100/H200 slow down in the high 80s; HBM at 95 C).
HOT_GPU_C = 85.0
HOT_MEMORY_C = 90.0

RESET_ACTION = "reset the GPU (nvidia-smi -r -i {bus} on the host, with no process on it) before a run uses it"
_RECOVERY = {
    "Reset": (RESET, "the driver asks for a GPU reset (gpu_recovery_action Reset): terminate its processes and "
              "reset it (nvidia-smi -r -i {bus})"),
    "Reboot": (RESET, "the driver asks for a reboot (gpu_recovery_action Reboot): reboot the host"),
    "Drain P2P": (RESET, "the driver asks to drain peer-to-peer traffic (gpu_recovery_action Drain P2P): schedule "
                  "no new work, stop the processes that use P2P, then query again (NVIDIA: reset if it stays)"),
    "Drain and Reset": (RESET, "the driver asks to drain and reset (gpu_recovery_action Drain and Reset): let "
                        "running work finish, schedule none, then reset the GPU (nvidia-smi -r -i {bus})"),
}


def worst(levels: Iterable[str]) -> str:
    """The worst of some verdict levels (ok when there are none)."""
    return max(levels, key=LEVELS.index, default=OK)


@dataclass(frozen=True)
class Problem:
    """One cause: the counter (a field name, `xid`, `nvidia-smi`), what it read, how bad, what to do."""

    counter: str
    value: Any
    level: str
    message: str
    action: str

    def as_json(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """A GPU's verdict: its identity, the worst level of its problems, and each problem."""

    index: Optional[int]
    bus_id: Optional[str]
    uuid: Optional[str]
    problems: List[Problem] = field(default_factory=list)

    @property
    def level(self) -> str:
        return worst(p.level for p in self.problems)

    @property
    def blocking(self) -> List[Problem]:
        """The problems that keep a run off the GPU (needs reset or service)."""
        return [p for p in self.problems if p.level in (RESET, SERVICE)]

    @property
    def warnings(self) -> List[Problem]:
        return [p for p in self.problems if p.level == WARN]

    def names(self) -> str:
        """`GPU 5 (00000000:9A:00.0, GPU-...)`: how a message names it."""
        who = ", ".join(x for x in (self.bus_id, self.uuid) if x)
        return "GPU %s" % ("?" if self.index is None else self.index) + (" (%s)" % who if who else "")

    def as_json(self) -> Dict[str, Any]:
        return {"index": self.index, "bus_id": self.bus_id, "uuid": self.uuid, "verdict": self.level,
                "problems": [p.as_json() for p in self.problems]}


def judge(h: GpuHealth, xids: Iterable[XidEvent] = ()) -> Verdict:
    """One GPU's verdict from its row and the Xids the host logged for it."""
    bus = h.bus_id or "BUS"
    found: List[Problem] = []
    for name, value in sorted(h.errors.items()):
        found.append(Problem(name, value, RESET, "nvidia-smi reads %s as %s: the GPU does not answer" % (name, value),
                             RESET_ACTION.format(bus=bus) + "; if that fails, reboot the host"))
    action = h.recovery_action
    if action is not None and action != "None":
        level, said = _RECOVERY.get(action, (RESET, "the driver reports a recovery action gpuops does not know: "
                                             "take the GPU out of service and check NVIDIA's nvidia-smi documentation"))
        found.append(Problem("gpu_recovery_action", action, level, "gpu_recovery_action is %s" % action,
                             said.format(bus=bus)))
    ecc = h.count("ecc.errors.uncorrected.volatile.total")
    if ecc:
        found.append(Problem("ecc.errors.uncorrected.volatile.total", ecc, RESET,
                             "%d uncorrected ECC error(s) since the driver loaded" % ecc,
                             RESET_ACTION.format(bus=bus) + "; if they come back, run NVIDIA's field diagnostic "
                             "(dcgmi diag -r 3) and contact NVIDIA support"))
    if h.flag("remapped_rows.failure"):
        found.append(Problem("remapped_rows.failure", "Yes", SERVICE, "a row remap failed (the GPU's memory ran out "
                             "of spare rows)", "take the GPU out of service: NVIDIA's RMA criterion (row-remapping "
                             "failure, confirmed by the field diagnostic); contact NVIDIA support"))
    if h.flag("remapped_rows.pending"):
        found.append(Problem("remapped_rows.pending", "Yes", RESET, "a row remap is pending",
                             RESET_ACTION.format(bus=bus) + " (the remap takes effect at the reset)"))
    if h.flag("retired_pages.pending"):
        found.append(Problem("retired_pages.pending", "Yes", RESET, "memory pages are pending retirement",
                             RESET_ACTION.format(bus=bus) + " or reload the driver (the pages retire then)"))
    for x in xids:
        x_info = x.info
        if x_info.level == OK:
            continue
        found.append(Problem("xid", x.code, x_info.level, "Xid %d (%s) in the host's kernel log%s" % (
            x.code, x_info.name, _when(x.t)), x_info.action.replace("BUS", bus)))
    found += _slowdowns(h)
    return Verdict(h.index, h.bus_id, h.uuid, found)


def _slowdowns(h: GpuHealth) -> List[Problem]:
    """What only slows the GPU: a slowdown reason, a narrow PCIe link, heat."""
    found = []
    mask = h.mask
    if mask is not None and mask & SLOWDOWN:
        active = list(reasons(mask & SLOWDOWN))
        found.append(Problem("clocks_event_reasons.active", "0x%016X" % mask, WARN, "clocks slowed: %s" % ", ".join(active),
                             "check the GPU's cooling and power delivery (a run on it is slower)"))
    link = h.link()
    if link["width"] is not None and link["width_max"] is not None and link["width"] < link["width_max"]:
        found.append(Problem("pcie.link.width.current", link["width"], WARN, "PCIe link x%d of x%d" % (
            link["width"], link["width_max"]), "reseat the GPU or check its riser (transfers are slower)"))
    for name, limit in (("temperature.gpu", HOT_GPU_C), ("temperature.memory", HOT_MEMORY_C)):
        temp = h.number(name)
        if temp is not None and temp >= limit:
            found.append(Problem(name, temp, WARN, "%s %g C (>= %g)" % (name, temp, limit),
                                 "check the GPU's cooling (it slows down when hot)"))
    return found


def judge_lost(lost: LostGpu, index: Optional[int] = None, uuid: Optional[str] = None,
               xids: Iterable[XidEvent] = ()) -> Verdict:
    """A GPU nvidia-smi could not open: it needs a reset, most often a reboot of the host."""
    problems = [Problem("nvidia-smi", lost.said, RESET, "nvidia-smi cannot open it: %s" % lost.said,
                        "reboot the host (NVIDIA: a lost GPU comes back after a reboot); if it stays lost, reseat it "
                        "or contact NVIDIA support")]
    for x in xids:
        if x.info.level != OK:
            problems.append(Problem("xid", x.code, x.info.level, "Xid %d (%s) in the host's kernel log%s" % (
                x.code, x.info.name, _when(x.t)), x.info.action.replace("BUS", lost.bus_id or "BUS")))
    return Verdict(index, lost.bus_id, uuid, problems)


def _when(t: Optional[float]) -> str:
    if t is None:
        return ""
    import time

    return " at " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def record_view(record: Dict[str, Any]) -> Dict[str, Any]:
    """A hardware.json record as `status`, `runs`, the summary and the notification carry it (`hardware`)."""
    xid = got if isinstance(got := record.get("xid"), dict) else None
    gpu = on if isinstance(on := record.get("gpu"), dict) else {}
    return {"rule": record.get("rule"), "gpu": {k: gpu.get(k) for k in ("index", "bus_id", "uuid")},
            "xid": None if xid is None else {k: xid.get(k) for k in ("code", "name", "resolution", "line", "t")},
            "counter": record.get("counter"), "value": record.get("value"), "message": record.get("message"),
            "action": record.get("action"), "instead_of": record.get("instead_of"),
            **({"restart_blocked": record["restart_blocked"]} if record.get("restart_blocked") else {})}


def record_words(record: Dict[str, Any]) -> str:
    """One line: `Xid 79 (GPU has fallen off the bus) on GPU 5 (00000000:9A:00.0, GPU-...): reboot the host ...`."""
    view = record_view(record)
    gpu = view["gpu"]
    who = ", ".join(str(x) for x in (gpu.get("bus_id"), gpu.get("uuid")) if x)
    where = "GPU %s%s" % ("?" if gpu.get("index") is None else gpu["index"], " (%s)" % who if who else "")
    xid = view["xid"]
    what = ("Xid %s (%s) on %s" % (xid.get("code"), xid.get("name"), where) if xid else
            "%s: %s" % (where, view.get("message") or view.get("counter") or view.get("rule")))
    return what + (": " + str(view["action"]) if view.get("action") else "")
