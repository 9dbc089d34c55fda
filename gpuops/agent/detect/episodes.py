"""The time-series pieces the quiet-failure detectors judge with: windows of points, episodes, swings."""

from __future__ import annotations

from typing import Deque, List, Optional, Tuple

__all__ = ["Episode", "in_window", "keep", "moves"]


class Episode:
    """Report once when a condition turns bad; re-arm after `window` seconds of it judged good."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.active = False
        self.good_since: Optional[float] = None

    def starts(self, t: float, bad: Optional[bool]) -> bool:
        """Feed one judgement (None: could not judge); True when a new episode begins."""
        if bad is None:
            self.good_since = None
            return False
        if bad:
            self.good_since = None
            began, self.active = not self.active, True
            return began
        if self.active:
            if self.good_since is None:
                self.good_since = t
            elif t - self.good_since >= self.window:
                self.active, self.good_since = False, None
        return False


def keep(points: Deque[Tuple[float, float]], t: float, horizon: float) -> None:
    """Forget what no window will look at again."""
    while points and points[0][0] < t - horizon:
        points.popleft()


def in_window(points: Deque[Tuple[float, float]], lo: float, hi: float) -> List[float]:
    """The values of the points in (lo, hi]."""
    return [v for at, v in points if lo < at <= hi]


def moves(points: List[Tuple[float, float]], threshold: float) -> List[float]:
    """When the series moved by more than threshold from its last turn (a zigzag): repeated swings
    make many moves, one excursion that comes back two, a jump to a new level one."""
    found: List[float] = []
    if not points:
        return found
    low = high = points[0][1]
    trend = 0  # +1 rising, -1 falling, 0 not moved yet
    for at, value in points[1:]:
        if trend <= 0 and value - low > threshold:  # the first move, or a turn up from the last low
            trend, high = 1, value
            found.append(at)
        elif trend >= 0 and high - value > threshold:  # the first move, or a turn down from the last high
            trend, low = -1, value
            found.append(at)
        if trend >= 0:
            high = max(high, value)
        if trend <= 0:
            low = min(low, value)
    return found
