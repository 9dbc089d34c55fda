"""gpu-ecc: a GPU of the run went bad in its memory during the run (watch.gpu_ecc): its uncorrected ECC errors
rose (`ecc.errors.uncorrected.volatile.total` above what the first sample read), a row remap became pending
or failed, or the driver asks for a recovery action (`gpu_recovery_action` other than None). Each is judged
by the verdict rules preflight uses (wire/verdict.py: the counter and NVIDIA's action); what a GPU already
showed when the run started (a launch with preflight.health: warn) is not reported again.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

from ..wire.verdict import Problem
from ..wire.verdict import judge as verdict
from . import judge
from .judge import Finding

ECC = "ecc.errors.uncorrected.volatile.total"
#: The counters this detector reports (the verdict's other problems are gpu-lost's, gpu-slowdown's, preflight's).
COUNTERS = (ECC, "remapped_rows.failure", "remapped_rows.pending", "gpu_recovery_action", "retired_pages.pending")


class Detector(judge.Detector):
    def __init__(self, settings: Any, run: judge.Run) -> None:
        super().__init__(settings, run)
        self.first: Dict[int, Optional[int]] = {}  # each GPU's uncorrected count at its first sample
        self.known: Set[Tuple[int, str]] = set()  # (GPU, counter) seen at the first sample, or reported
        self.pending: List[Tuple[int, Any, Problem]] = []

    def health(self, t: float, sample: Any) -> None:
        for index, row in sample.rows.items():
            count = row.count(ECC)
            first = index not in self.first
            if first:
                self.first[index] = count
            for problem in verdict(row).problems:
                if problem.counter not in COUNTERS:
                    continue
                if problem.counter == ECC:
                    base = self.first[index] or 0
                    if count is None or count <= base:
                        continue
                    problem = Problem(ECC, count, problem.level, "%d new uncorrected ECC error(s) during the run "
                                      "(%d at its start, %d now)" % (count - base, base, count), problem.action)
                key = (index, problem.counter)
                if key in self.known:
                    continue
                self.known.add(key)
                if not first:
                    self.pending.append((index, row, problem))

    def judge(self, t: float) -> List[Finding]:
        found = []
        for index, row, problem in self.pending:
            who = ", ".join(str(x) for x in (row.bus_id, row.uuid) if x)
            found.append(Finding(
                "gpu-ecc", self.settings.action, "GPU %d%s: %s" % (index, " (%s)" % who if who else "", problem.message),
                problem.action, {"gpu": index, "bus_id": row.bus_id, "uuid": row.uuid, "counter": problem.counter,
                                 "value": problem.value, "level": problem.level}))
        self.pending = []
        return found
