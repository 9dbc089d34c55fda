"""gpu-xid: an Xid on a GPU of the run, as the host's kernel log showed it (watch.gpu_xid; the host's follower,
watch.host_kernel_log, hands each one over through host-xids.jsonl).

An Xid that needs a reset or more (NVIDIA's Xid catalog: reset the GPU, reboot, contact support, check the
hardware; wire/xid.py) takes the detector's action (default abort: the run exits 10, `hardware`); one whose
resolution is to restart the application (Xid 13, 31, 94: the application's fault or a contained error) only
warns, and one the catalog says to ignore (43, 45, 63) is left in host-xids.jsonl. Each Xid of each GPU is
reported once.
"""

from __future__ import annotations

from typing import Any, Dict, List

from ..wire.xid import OK, RESET, SERVICE
from . import judge
from .judge import WARN, Finding


def words(record: Dict[str, Any]) -> str:
    """`Xid 79 (GPU has fallen off the bus) on GPU 5 (00000000:9A:00.0, GPU-...)`."""
    who = ", ".join(str(x) for x in (record.get("bus_id"), record.get("uuid")) if x)
    return "Xid %s (%s) on GPU %s%s" % (record.get("code"), record.get("name") or "not in the catalog",
                                        record.get("index"), " (%s)" % who if who else "")


class Detector(judge.Detector):
    def __init__(self, settings: Any, run: judge.Run) -> None:
        super().__init__(settings, run)
        self.pending: List[Dict[str, Any]] = []

    def xid(self, t: float, record: Dict[str, Any]) -> None:
        if record.get("level") != OK and isinstance(record.get("index"), int):
            self.pending.append(record)

    def judge(self, t: float) -> List[Finding]:
        found = []
        for r in self.pending:
            grave = r.get("level") in (RESET, SERVICE)
            action = self.settings.action if grave else WARN
            advice = str(r.get("action") or "").replace("BUS", str(r.get("bus_id") or "its bus id"))
            message = "%s in the host's kernel log: %s" % (words(r), r.get("line") or r.get("message") or "")
            figures = {"gpu": r.get("index"), "bus_id": r.get("bus_id"), "uuid": r.get("uuid"), "xid": r.get("code"),
                       "name": r.get("name"), "resolution": r.get("resolution"), "level": r.get("level"),
                       "line": r.get("line"), "t": r.get("t")}
            found.append(Finding("gpu-xid", action, message, advice, figures))
        self.pending = []
        return found
