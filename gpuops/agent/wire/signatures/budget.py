"""A time budget for the regexes users write: one catastrophic pattern must not switch off every safeguard.

Python's regex engine cannot be given a deadline, but it checks for signals while it
backtracks, so a SIGALRM handler can stop it. ``Guard.search`` runs an untrusted pattern
with an interval timer ticking; a search still running after ``budget`` seconds raises
inside the engine, is caught here, and the rule is disabled for good (``disabled``,
``take_disabled``): the built-in rules, the stall clock and ``--timeout`` keep working.

Signals reach only the main thread: elsewhere (or without setitimer) searches run unguarded.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

#: Seconds one untrusted pattern may take on one line before it is disabled.
BUDGET = 1.0
TICK = 0.05


class RuleTimeout(Exception):
    """Raised by the timer inside a regex search that ran past its budget."""


class Guard:
    """Runs untrusted regex searches under a time budget, inside ``with guard:`` (a batch of searches).

    The timer is started by the batch's first untrusted search and stopped when the batch
    ends, so batches without one cost nothing; a SIGALRM handler and timer that were there
    before (pytest-timeout's, say) are put back, the timer with what was left of it.
    """

    def __init__(self, budget: float = BUDGET, tick: float = TICK) -> None:
        self.budget, self.tick = budget, tick
        self.disabled: Dict[str, float] = {}  # rule name -> seconds its last search ran
        self._new: List[Tuple[str, float]] = []
        self._rule: Optional[str] = None
        self._started = 0.0
        self._depth = 0
        self._armed = False
        self._armed_at = 0.0
        self._previous: Any = None
        self._previous_timer: Tuple[float, float] = (0.0, 0.0)
        self.usable = hasattr(signal, "setitimer")

    def search(self, name: str, regex: Any, text: str) -> Any:
        """regex.search(text), or None once the rule is disabled (and when this search disables it)."""
        if name in self.disabled:
            return None
        if not self._depth:
            return regex.search(text)
        if not self._armed:
            self._arm()
        try:
            self._started = time.monotonic()
            self._rule = name
            try:
                found = regex.search(text)
            finally:
                self._rule = None
            return found
        except RuleTimeout:
            seconds = time.monotonic() - self._started
            self.disabled[name] = seconds
            self._new.append((name, seconds))
            return None

    def take_disabled(self) -> List[Tuple[str, float]]:
        """Rules disabled since the last call: (name, seconds), to be reported once."""
        new, self._new = self._new, []
        return new

    def __enter__(self) -> "Guard":
        if self.usable and (self._depth or threading.current_thread() is threading.main_thread()):
            self._depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._depth:
            self._depth -= 1
            if not self._depth and self._armed:
                self._disarm()

    def _arm(self) -> None:
        self._previous = signal.signal(signal.SIGALRM, self._on_tick)
        self._previous_timer = signal.setitimer(signal.ITIMER_REAL, self.tick, self.tick)
        self._armed_at = time.monotonic()
        self._armed = True

    def _disarm(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._previous if self._previous is not None else signal.SIG_DFL)
        delay, interval = self._previous_timer
        if delay > 0:
            left = delay - (time.monotonic() - self._armed_at)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), interval)
        self._armed = False

    def _on_tick(self, signum: int, frame: Any) -> None:
        self._tick()

    def _tick(self) -> None:
        if self._rule is not None and time.monotonic() - self._started >= self.budget:
            raise RuleTimeout(self._rule)
