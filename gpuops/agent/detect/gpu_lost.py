"""gpu-lost: a GPU of the run stops answering or disappears (watch.gpu_lost).

At once when nvidia-smi cannot open it (`Unable to determine the device handle for GPU<bus id>: ...`, the GPU
known by the bus id its earlier samples read) or reads its fields as an error (`[GPU requires reset]`,
`[Unknown Error]`); after `window` seconds when the samples go on without it. What nvidia-smi prints for a
lost GPU is from field reports, not seen on a real lost GPU here (docs/health.md).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

from ..wire.verdict import judge_lost
from ..wire.xid import bus_key
from . import judge
from .judge import Finding


class Detector(judge.Detector):
    def __init__(self, settings: Any, run: judge.Run) -> None:
        super().__init__(settings, run)
        self.bus: Dict[str, Tuple[int, Optional[str], Optional[str]]] = {}  # bus key -> index, bus id, uuid
        self.ids: Dict[int, Tuple[Optional[str], Optional[str]]] = {}  # index -> bus id, uuid
        self.missing_since: Dict[int, float] = {}
        self.missing_count: Dict[int, int] = {}
        self.lost: Set[int] = set()
        self.pending: List[Tuple[int, str, str]] = []  # index, what was seen, the action

    def health(self, t: float, sample: Any) -> None:
        for index, row in sample.rows.items():
            self.missing_since.pop(index, None)
            self.missing_count.pop(index, None)
            if row.bus:
                self.bus[row.bus] = (index, row.bus_id, row.uuid)
                self.ids[index] = (row.bus_id, row.uuid)
            if row.errors:
                said = ", ".join("%s %s" % kv for kv in sorted(row.errors.items()))
                self._lost(index, "nvidia-smi reads its fields as errors (%s)" % said, judge_lost_action())
        for lost in sample.lost:
            known = self.bus.get(bus_key(lost.bus_id or "") or "")
            if known is not None:
                self._lost(known[0], lost.said, judge_lost(lost).problems[0].action)
        for index in sample.missing:
            since = self.missing_since.setdefault(index, t)
            self.missing_count[index] = self.missing_count.get(index, 0) + 1
            if t - since >= self.settings.window and self.missing_count[index] >= 2:
                self._lost(index, "it has been missing from nvidia-smi's samples for %.0f s" % (t - since),
                           judge_lost_action())

    def _lost(self, index: int, seen: str, action: str) -> None:
        if index not in self.lost:
            self.lost.add(index)
            self.pending.append((index, seen, action))

    def judge(self, t: float) -> List[Finding]:
        found = []
        for index, seen, action in self.pending:
            bus_id, uuid = self.ids.get(index, (None, None))
            who = ", ".join(str(x) for x in (bus_id, uuid) if x)
            found.append(Finding("gpu-lost", self.settings.action, "GPU %d%s stopped answering: %s" % (
                index, " (%s)" % who if who else "", seen), action,
                {"gpu": index, "bus_id": bus_id, "uuid": uuid, "counter": "nvidia-smi", "seen": seen}))
        self.pending = []
        return found


def judge_lost_action() -> str:
    """What NVIDIA says to do about a GPU that no longer answers."""
    from ..wire.health import LostGpu

    return judge_lost(LostGpu(None, "")).problems[0].action
