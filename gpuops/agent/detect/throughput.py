"""Throughput figures read from a run's log: each sample records the median of those logged since the last."""

from __future__ import annotations

import math
from collections import deque
from typing import Deque, Pattern, Sequence

__all__ = ["FIGURE", "Figures", "figure", "finite", "median", "parse_figure"]

#: The metric rule whose figures are the run's throughput: the telemetry's `tp` (quiet_failures.py), and
#: what throughput-drop judges (its pattern is watch.throughput.pattern).
FIGURE = "throughput"


def median(values: Sequence[float]) -> float:
    """The middle value (the mean of the middle two for an even count); not statistics': 4 ms to import."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def finite(value: float | None) -> float | None:
    """The value, or None when it is missing, NaN or infinite (a figure that cannot be compared)."""
    return value if value is not None and math.isfinite(value) else None


class Figures:
    """Throughput figures logged between two samples: each sample records their median."""

    def __init__(self, keep: int = 4096) -> None:
        self._values: Deque[float] = deque(maxlen=keep)

    def add(self, value: float) -> None:
        if finite(value) is not None:
            self._values.append(value)

    def take(self) -> float | None:
        """The median since the last take (None if none was logged), and start over."""
        if not self._values:
            return None
        value = median(self._values)
        self._values.clear()
        return value


def figure(pattern: Pattern[str], line: str) -> float | None:
    """The throughput figure in a log line: the pattern's first group (or whole match), thousands separators allowed."""
    match = pattern.search(line)
    if match is None:
        return None
    text = match.group(1) if pattern.groups else match.group(0)
    return None if text is None else parse_figure(text)


def parse_figure(text: str) -> float | None:
    """A logged figure as a number: thousands separators allowed; None when it is no finite number."""
    try:
        return finite(float(text.replace(",", "").replace("_", "")))
    except ValueError:
        return None
