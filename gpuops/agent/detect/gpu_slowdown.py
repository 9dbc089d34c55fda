"""gpu-slowdown: a GPU of the run slowed by its hardware for `window` seconds in a row (watch.gpu_slowdown): a
hardware slowdown, a thermal one (hardware or software) or the power brake in every sample's
`clocks_event_reasons.active` (wire/health.SLOWDOWN). A power cap at full load is normal and not counted
(tests/data/real_h200/health/load.txt: `sw_power_cap` Active at ~680 W of 700 W). Warns by default: the run is
slower, not wrong. Once per episode; a GPU back at full clocks for a window re-arms it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set

from ..wire.health import SLOWDOWN, reasons
from . import judge
from .episodes import Episode
from .judge import Finding


class Detector(judge.Detector):
    def __init__(self, settings: Any, run: judge.Run) -> None:
        super().__init__(settings, run)
        self.since: Dict[int, Optional[float]] = {}
        self.count: Dict[int, int] = {}
        self.seen: Dict[int, Set[str]] = {}
        self.episodes: Dict[int, Episode] = {}
        self.ids: Dict[int, Any] = {}
        self.pending: List[int] = []

    def health(self, t: float, sample: Any) -> None:
        for index, row in sample.rows.items():
            mask = row.mask
            self.ids[index] = (row.bus_id, row.uuid)
            slowed = None if mask is None else bool(mask & SLOWDOWN)
            if slowed:
                self.since.setdefault(index, t)
                self.count[index] = self.count.get(index, 0) + 1
                self.seen.setdefault(index, set()).update(reasons(mask & SLOWDOWN))
            elif slowed is False:
                self.since.pop(index, None)
                self.count.pop(index, None)
            start = self.since.get(index)
            lasting = None if slowed is None else bool(slowed and start is not None and t - start >= self.settings.window
                                                       and self.count.get(index, 0) >= 2)
            if self.episodes.setdefault(index, Episode(self.settings.window)).starts(t, lasting):
                self.pending.append(index)

    def judge(self, t: float) -> List[Finding]:
        found = []
        for index in self.pending:
            bus_id, uuid = self.ids.get(index, (None, None))
            who = ", ".join(str(x) for x in (bus_id, uuid) if x)
            why = ", ".join(sorted(self.seen.get(index, ())))
            found.append(Finding(
                "gpu-slowdown", self.settings.action, "GPU %d%s slowed by its hardware for %.0f s or more: %s" % (
                    index, " (%s)" % who if who else "", self.settings.window, why),
                "check the GPU's cooling and power delivery (clocks_event_reasons: %s); the run is slower on it" % why,
                {"gpu": index, "bus_id": bus_id, "uuid": uuid, "counter": "clocks_event_reasons.active",
                 "reasons": sorted(self.seen.get(index, ()))}))
            self.seen.pop(index, None)
        self.pending = []
        return found
