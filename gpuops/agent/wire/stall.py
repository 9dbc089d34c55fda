"""When a silent log means a stalled run: a fixed timeout, or one learned from the run's own rhythm.

Pure: the watchdog says when the log grew (``grew``) and asks at any time whether the run has
been silent too long (``stalled``). No clock is read here.

Fixed mode (``auto`` is None): stalled after ``timeout`` seconds without log growth; 0 is off.

Auto mode sizes the timeout the way NVIDIA resiliency-ext sizes its heartbeat timeouts: the
longest interval observed, times a factor, with the first iterations skipped. Until ``settle``
seconds after ``started`` have passed *and* ``MIN_GAPS`` gaps between growths were seen after
that, the timeout is ``initial`` (startup, data loading and the first compile are slow and
silent, so they are neither judged tightly nor learned from). From then on it is
``max(floor, factor x the longest gap seen after settle)``; it only ever grows, as longer gaps
(an eval, a checkpoint) are seen and survived.

Known hazard: the learned timeout covers only the silences the run has shown so far. A run
that prints every 2 s learns max(30, 5 x 2) = 30 s; if its *first* checkpoint save (or eval,
or a rank waiting on a slow peer) is silent for longer than that, auto mode calls it a stall
and the run is stopped. Set ``floor`` above the longest silent phase you expect (a checkpoint
of a large model can take minutes), or use a fixed timeout for runs with rare long silences.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from .watchfile import STALL_AUTO

__all__ = ["AUTO_DEFAULTS", "MIN_GAPS", "StallClock"]

#: floor and initial in seconds, settle in seconds after the run started.
AUTO_DEFAULTS: Dict[str, float] = STALL_AUTO  # watch.json's defaults live in watchfile
#: Gaps between growths seen after settle before the learned timeout replaces `initial`.
MIN_GAPS = 5


class StallClock:
    """Silence since the last log growth against a fixed or learned timeout (see the module docstring).

    In auto mode a missing ``initial`` is ``timeout`` when that is > 0, so a playbook's
    ``stall_timeout`` stays the limit while the run settles.
    """

    def __init__(self, timeout: float, auto: Optional[Dict[str, float]], started: float) -> None:
        self.timeout = max(0.0, float(timeout))
        self.auto: Optional[Dict[str, float]] = None
        if auto is not None:
            initial = self.timeout if self.timeout > 0 else AUTO_DEFAULTS["initial"]
            self.auto = {**AUTO_DEFAULTS, "initial": initial, **{k: float(v) for k, v in auto.items()}}
        self.started = started
        self.last_growth = started  # silence counts from the start: a run that never prints stalls too
        self.longest_gap = 0.0
        self.gaps = 0

    def grew(self, t: float) -> None:
        """The log grew at t: a gap ends; in auto mode, gaps that began after settle teach the timeout."""
        if t <= self.last_growth:
            return  # the same instant, or a clock that stepped back: no gap to learn from
        if self.auto is not None and self.last_growth >= self.started + self.auto["settle"]:
            self.gaps += 1
            self.longest_gap = max(self.longest_gap, t - self.last_growth)
        self.last_growth = t

    def learned(self) -> bool:
        """Whether auto mode has seen enough of the run to replace `initial` with its own figure."""
        return self.auto is not None and self.gaps >= MIN_GAPS

    def timeout_now(self, t: float) -> float:
        """Seconds of silence that count as a stall at time t; 0 means stall detection is off."""
        if self.auto is None:
            return self.timeout
        if not self.learned() or t < self.started + self.auto["settle"]:
            return self.auto["initial"]
        return max(self.auto["floor"], self.auto["factor"] * self.longest_gap)

    def silent_for(self, t: float) -> float:
        """Seconds since the log last grew (since the start if it never did)."""
        return max(0.0, t - self.last_growth)

    def stalled(self, t: float) -> bool:
        limit = self.timeout_now(t)
        return limit > 0 and self.silent_for(t) >= limit

    def describe(self) -> Dict[str, Any]:
        """What the stall clock stands on, for status, events and the abort record."""
        out: Dict[str, Any] = {
            "mode": "fixed" if self.auto is None else "auto",
            "timeout": self.timeout_now(self.last_growth),
            "longest_gap": round(self.longest_gap, 3) if self.gaps else None,
            "gaps": self.gaps,
            "last_growth": self.last_growth,
        }
        if self.auto is not None:
            out.update(learned=self.learned(), **self.auto)
        return out

    def restore(self, state: Dict[str, Any]) -> None:
        """Carry on from an earlier describe() (a restarted watchdog keeps what the run taught it)."""
        self.last_growth = max(self.last_growth, float(state.get("last_growth") or self.started))
        self.gaps = int(state.get("gaps") or 0)
        self.longest_gap = float(state.get("longest_gap") or 0.0)
