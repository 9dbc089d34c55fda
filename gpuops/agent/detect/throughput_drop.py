"""throughput-drop (watch.throughput): the run's throughput, read from its log, fell against the baseline.

It judges the median of the window's figures, or of the last MIN_FIGURES figures when a slowdown left
fewer in the window (5x slower is 5x fewer step lines), and the rate of figures against the baseline's:
step lines far rarer than the good run's are a drop too, unless their spacing is the good run's (a
periodic eval pause leaves one long gap, not rarer steps). A pattern that matches nothing is said once
(a `no-throughput` note).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from . import judge
from .episodes import Episode, in_window, keep
from .judge import EAGER_ADVICE, MIN_FIGURES, NOTE, Baseline, Finding, base_figures, n
from .throughput import FIGURE, median, parse_figure

THROUGHPUT_DROP = "throughput-drop"
NO_THROUGHPUT = "no-throughput"  # note: no throughput figure to judge



class Detector(judge.Detector):
    """The throughput figures since settle against the baseline's level and rate."""

    def __init__(self, settings: Any, run: judge.Run) -> None:
        super().__init__(settings, run)
        self._figures: Deque[Tuple[float, float]] = deque(maxlen=100_000)
        self._last_figures: Deque[float] = deque(maxlen=MIN_FIGURES)  # after settle, however old
        self._steady = (0, None, None)  # type: Tuple[int, Optional[float], Optional[float]]
        self._episode = Episode(settings.window)
        self._noted = False

    @classmethod
    def metrics(cls, settings: Any) -> Sequence[Tuple[str, str]]:
        return ((FIGURE, settings.pattern),) if settings.pattern else ()

    @classmethod
    def span(cls, settings: Any, baseline: Optional[Baseline]) -> float:
        rate = baseline.figure_rate if baseline is not None else None
        return _rate_span(settings, rate) if rate else settings.window

    def measure(self, t: float, name: str, value: str) -> None:
        figure = parse_figure(value) if name == FIGURE else None
        if figure is None:
            return
        self._figures.append((t, figure))
        keep(self._figures, t, self.run.horizon)
        if t >= self.run.started + self.settings.settle:
            self._last_figures.append(figure)
            count, first, _ = self._steady
            self._steady = (count + 1, t if first is None else first, t)

    def profile(self) -> Dict[str, Any]:
        """Throughput figures a second since settle (what a later run's step-line rate is judged by)."""
        count, first, last = self._steady
        rate = None if count < MIN_FIGURES or first is None or last is None or last <= first else (count - 1) / (last - first)
        return {"figure_rate": rate}

    def missing(self, gpus: Sequence[int]) -> List[str]:
        b = self.run.baseline
        return ["throughput"] if b is None or b.throughput is None else []

    def judge(self, t: float) -> List[Finding]:
        cfg, b, started = self.settings, self.run.baseline, self.run.started
        if t < started + cfg.settle:
            return []
        window = cfg.window
        values = in_window(self._figures, max(t - window, started + cfg.settle), t)
        over = "the last %g s" % window
        if len(values) < MIN_FIGURES:  # a slowdown leaves fewer figures a window: judge the last ones
            values, over = list(self._last_figures), "its last %d figures" % len(self._last_figures)
        measured = median(values) if len(values) >= MIN_FIGURES else None
        rate = self._rate(t)
        found = self._note_no_figures(t)
        if b is None or not b.throughput:
            return found
        slow = None if measured is None else measured < cfg.min_ratio * b.throughput
        rare = None if rate is None else rate[0] < cfg.min_ratio * rate[1]
        if rare and rate is not None and (self._pace(t) or 0.0) >= cfg.min_ratio * rate[1]:
            rare = False  # the figures come as often as the baseline's when they come: a pause (an eval), not slow steps
        bad = None if slow is None and rare is None else bool(slow or rare)
        if not self._episode.starts(t, bad):
            return found
        what = []
        if slow and measured is not None:
            what.append("throughput %s/s over %s is %.2fx the baseline %s/s" % (
                n(measured), over, measured / b.throughput, n(b.throughput)))
        if rare and rate is not None:
            what.append("%.3g throughput figures a second over the last %g s is %.2fx the baseline's %.3g "
                        "(fewer step lines: slower steps)" % (rate[0], rate[2], rate[0] / rate[1], rate[1]))
        ratio = measured / b.throughput if slow and measured is not None else rate[0] / rate[1] if rate else 1.0
        message = "; ".join(what) + " (run %s)" % (b.run or b.source)
        figures = {"measured": measured, "baseline": b.throughput, "ratio": round(ratio, 4), "gpu": None,
                   "window": window, "n": len(values), "min_ratio": cfg.min_ratio,
                   "figure_rate": None if rate is None else round(rate[0], 6),
                   "baseline_figure_rate": None if rate is None else round(rate[1], 6), **base_figures(b)}
        return found + [Finding(THROUGHPUT_DROP, cfg.action, message, EAGER_ADVICE, figures)]

    def _rate(self, t: float) -> Optional[Tuple[float, float, float]]:
        """(figures a second now, the baseline's, over how many seconds), once a whole span is past settle."""
        b = self.run.baseline
        base = b.figure_rate if b is not None else None
        if not base or base <= 0 or self._steady[0] == 0:  # no figure at all is a pattern to check, not a rate
            return None
        span = _rate_span(self.settings, base)
        if t < self.run.started + self.settings.settle + span:
            return None
        return len(in_window(self._figures, t - span, t)) / span, base, span

    def _pace(self, t: float) -> Optional[float]:
        """Figures a second as their spacing says: the median gap between the last few since settle (None
        with fewer than two). A pause leaves one long gap, slower steps make every gap long."""
        since, times = self.run.started + self.settings.settle, []  # type: float, List[float]
        for at, _ in reversed(self._figures):
            if at > t:
                continue
            if at < since or len(times) > MIN_FIGURES:
                break
            times.append(at)
        gaps = [a - b for a, b in zip(times, times[1:])]
        gap = median(gaps) if gaps else 0.0
        return 1.0 / gap if gap > 0 else None

    def _note_no_figures(self, t: float) -> List[Finding]:
        """Once: not one figure a window past settle (a pattern that matches nothing); a few are waited for."""
        cfg = self.settings
        if self._steady[0] or t < self.run.started + cfg.settle + cfg.window or self._noted:
            return []
        self._noted = True
        message = "no throughput figure in the %g s since settle: %s judges %d or more" % (
            t - self.run.started - cfg.settle, THROUGHPUT_DROP, MIN_FIGURES)
        advice = "check throughput.pattern against the log (its first group is the figure)"
        figures = {"n": 0, "window": cfg.window, "pattern": cfg.pattern}
        return [Finding(NO_THROUGHPUT, NOTE, message, advice, figures)]


def _rate_span(settings: Any, base: float) -> float:
    """The span a figure rate is counted over: a window, or long enough to expect MIN_FIGURES figures."""
    return max(settings.window, MIN_FIGURES / base)
