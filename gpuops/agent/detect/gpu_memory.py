"""gpu-memory-shift and gpu-memory-volatile (watch.gpu_memory): a GPU's memory against its baseline level,
and how it moves.

gpu-memory-shift: a GPU's steady level (the window's median) above max_ratio x its baseline level, or
below it / max_ratio. gpu-memory-volatile: repeated swings (SWINGS moves of more than max_swing_mib
within the window, as the eager fallback's per-step allocations make) or a jump to a new level held for
half a window; never one excursion that comes back (a checkpoint holding +3 GiB for 2 s), also once its
way out has left the window (the window before it is looked at too).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from ..wire.smi import GpuSample
from . import judge
from .episodes import Episode, keep, moves
from .judge import EAGER_ADVICE, MIN_FIGURES, Baseline, Finding, base_figures, n
from .throughput import median

MEMORY_SHIFT = "gpu-memory-shift"
MEMORY_VOLATILE = "gpu-memory-volatile"
SWINGS = 3  # moves beyond max_swing_mib within a window that make memory volatile (one excursion is two)

LOWER_ADVICE = (
    "less memory than the good run: a worker thread may have died (the FX race kills a drafter thread "
    "while the process runs on; look for 'Exception in thread') or the batch shrank")


class Detector(judge.Detector):
    """Each GPU's memory samples since settle, against its baseline level and for swings."""

    def __init__(self, settings: Any, run: judge.Run) -> None:
        super().__init__(settings, run)
        self._memory: Dict[int, Deque[Tuple[float, float]]] = {}
        self._episodes: Dict[Tuple[str, int], Episode] = {}

    @classmethod
    def span(cls, settings: Any, baseline: Optional[Baseline]) -> float:
        return float(settings.window)

    def sample(self, t: float, gpus: GpuSample) -> None:
        for gpu, (memory, _util) in gpus.items():
            points = self._memory.setdefault(gpu, deque(maxlen=10_000))
            if memory is not None:
                points.append((t, float(memory)))
            keep(points, t, self.run.horizon)

    def missing(self, gpus: Sequence[int]) -> List[str]:
        b = self.run.baseline
        if not ((b.gpu_memory or {}) if b else {}):
            return ["GPU memory"]
        return ["GPU memory of GPU %s" % ", ".join(map(str, gpus))] if gpus else []

    def judge(self, t: float) -> List[Finding]:
        cfg = self.settings
        since = self.run.started + cfg.settle
        if t < since:
            return []
        found: List[Finding] = []
        lo, before = max(t - cfg.window, since), max(t - 2 * cfg.window, since)
        for gpu in sorted(self._memory):
            wider = [(at, v) for at, v in self._memory[gpu] if before < at <= t]
            points = [(at, v) for at, v in wider if at > lo]
            values = [v for _, v in points]
            found += self._shift(t, gpu, values) + self._volatile(t, gpu, points, wider)
        return found

    def _episode(self, rule: str, gpu: int) -> Episode:
        return self._episodes.setdefault((rule, gpu), Episode(self.settings.window))

    def _shift(self, t: float, gpu: int, values: List[float]) -> List[Finding]:
        cfg, b = self.settings, self.run.baseline
        level = ((b.gpu_memory or {}) if b else {}).get(gpu)
        if not level or level <= 0:
            return []
        measured = median(values) if len(values) >= MIN_FIGURES else None
        ratio = None if measured is None else measured / level
        bad = None if ratio is None else not (1.0 / cfg.max_ratio <= ratio <= cfg.max_ratio)
        began = self._episode(MEMORY_SHIFT, gpu).starts(t, bad)
        if not began or ratio is None or measured is None:
            return []
        assert b is not None  # a level came from it
        message = "GPU %d memory %s MiB over the last %g s is %.2fx the baseline %s MiB (run %s)" % (
            gpu, n(measured), cfg.window, ratio, n(level), b.run or b.source)
        advice = EAGER_ADVICE if ratio > 1 else LOWER_ADVICE
        figures = {"measured": measured, "baseline": level, "ratio": round(ratio, 4), "gpu": gpu,
                   "window": cfg.window, "n": len(values), "max_ratio": cfg.max_ratio, **base_figures(b)}
        return [Finding(MEMORY_SHIFT, cfg.action, message, advice, figures)]

    def _volatile(self, t: float, gpu: int, points: List[Tuple[float, float]],
                  wider: List[Tuple[float, float]]) -> List[Finding]:
        cfg = self.settings
        values = [v for _, v in points]
        turns = moves(points, cfg.max_swing_mib) if len(points) >= MIN_FIGURES else None
        # one move whose new level held for half a window (and the old one a quarter before it) is a jump,
        # unless it is the way back of an excursion whose way out has just left the window (the window
        # before it holds that one other move): a return to the old level is no new one
        jump = turns is not None and len(turns) == 1 and t - turns[0] >= cfg.window / 2 and (
            turns[0] - points[0][0] >= cfg.window / 4) and len(moves(wider, cfg.max_swing_mib)) != 2
        bad = None if turns is None else len(turns) >= SWINGS or jump
        began = self._episode(MEMORY_VOLATILE, gpu).starts(t, bad)
        if not began or turns is None:
            return []
        swing = max(values) - min(values)
        if jump:
            how = "jumped from %s to %s MiB and stayed" % (n(values[0]), n(values[-1]))
        else:
            how = "swung %d times by more than %s MiB" % (len(turns), n(cfg.max_swing_mib))
        message = "GPU %d memory %s within the last %g s (%s-%s MiB), now %s MiB" % (
            gpu, how, cfg.window, n(min(values)), n(max(values)), n(values[-1]))
        advice = ("memory that swings by GBs each step, or jumps to a new level mid-run, is eager code allocating "
                  "per step (empty_cache, expandable_segments) or the switch to the eager fallback: " + EAGER_ADVICE)
        figures = {"measured": swing, "min": min(values), "max": max(values), "first": values[0], "last": values[-1],
                   "swings": len(turns), "kind": "jump" if jump else "swings",
                   "gpu": gpu, "window": cfg.window, "n": len(values), "max_swing_mib": cfg.max_swing_mib,
                   "baseline": None, "ratio": None, **base_figures(self.run.baseline)}
        return [Finding(MEMORY_VOLATILE, cfg.action, message, advice, figures)]
